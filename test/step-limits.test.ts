/**
 * A workflow step's limits hold for its whole handoff chain (issue 46): every hop runs within the
 * step's time limit (or its agent's own, if shorter), under the step's retry and in the step's
 * pool. Against a real nats-server, a dispatcher and host workers of two pools.
 */

import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";

const host = { trusted: true, runtime: { sandbox: "host" as const } };
/** Hands off at once to `to`. */
const handsTo = (to: string) => ({ command: `printf '{"handoff":{"to":"${to}"}}' > "$BOXCAR_RESULT_FILE"`, handoffs: [to] });

test("each hop of a step's chain runs within the step's limits: its timeout (or the agent's, if shorter), its retry and its pool", async () => {
  await using nats = await natsFixture();
  await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  await using worker = createWorker({
    ...nats.workerRole,
    pools: ["default", "side"],
    concurrency: 4,
    providers: [createHostSandboxProvider()],
  });
  void worker.run();
  const client = createClient(nats.topology);
  await client.applyAgent({ name: "slow", ...host, command: "sleep 20", runtime: { sandbox: "host", timeout: "2m" } });
  await client.applyAgent({ name: "brief", ...host, command: "sleep 20", runtime: { sandbox: "host", timeout: "1s" } });
  await client.applyAgent({ name: "to-slow", ...host, ...handsTo("slow") });
  await client.applyAgent({ name: "to-brief", ...host, ...handsTo("brief") });

  // The second hop would pass the step's 3 s: it is stopped at 3 s, and the step fails saying so.
  const { run } = await client.startRun({
    workflow: { name: "bounded", steps: [{ name: "s", agent: "to-slow", timeout: "3s", retry: { maxAttempts: 1 }, pool: "side" }] },
    input: null,
  });
  const ended = await client.waitForRun(run.id);
  expect(ended.state).toBe("failed");
  const [first, hop] = ended.steps.s?.instances[0]?.jobs ?? [];
  const hopJob = await client.getJob(hop as string);
  expect(hopJob).toMatchObject({
    agent: "slow",
    state: "timed_out",
    pool: "side",
    spec: { timeout: 3_000, retry: { maxAttempts: 1 } },
    error: { message: expect.stringContaining("time limit of 3000 ms") },
  });
  expect((await client.getJob(first as string)).pool).toBe("side");
  expect(ended.error?.message).toContain("time limit of 3000 ms");

  // A hop whose agent allows less than the step: the shorter wins.
  const { run: shorter } = await client.startRun({
    workflow: { name: "tighter", steps: [{ name: "s", agent: "to-brief", timeout: "10s" }] },
    input: null,
  });
  const tight = await client.waitForRun(shorter.id);
  const briefJob = await client.getJob(tight.steps.s?.instances[0]?.jobs[1] as string);
  expect(briefJob).toMatchObject({ agent: "brief", state: "timed_out", spec: { timeout: 1_000 } });
});
