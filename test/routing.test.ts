import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode } from "@boxcar/protocol";
import { createHostSandboxProvider, createWorker, type WorkerOptions } from "@boxcar/worker";
import { expect, test } from "vitest";
import { eventually } from "./helpers/cli.js";
import { natsFixture } from "./helpers/nats.js";

/** An untrusted agent that asks for `auto`: host sandboxes may run it only under `host: always`. */
const untrusted = { name: "untrusted", command: "echo ran", runtime: { sandbox: "auto" } } as const;

/** Workers here offer only host sandboxes; their policies decide whether they may run the agent. */
const hostWorker = (role: Pick<WorkerOptions, "topology" | "dispatcherKeys">, host: "never" | "trusted" | "always") =>
  createWorker({ ...role, providers: [createHostSandboxProvider()], policy: { host }, heartbeatMs: 300 });

test("a job a worker may not run goes back to the pool for one that may", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(untrusted);
  await using strict = hostWorker(nats.workerRole, "trusted");
  await using lenient = hostWorker(nats.workerRole, "always");
  void strict.run();
  void lenient.run();
  await eventually(async () => ((await client.listWorkers()).length === 2 ? true : undefined), "both workers to be live");

  const ids = await Promise.all(Array.from({ length: 6 }, () => client.submit({ agent: "untrusted" }).then((r) => r.job.id)));
  const finals = await Promise.all(ids.map((id) => client.waitForJob(id)));
  expect(finals.map((j) => [j.state, j.workerId, j.attempt])).toEqual(finals.map(() => ["succeeded", lenient.id, 1]));
  expect(finals[0]?.sandbox?.reason).toMatch(/auto: host/);
});

test("the submitter is told at once when no live worker of the pool may run the agent, and why", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(untrusted);
  await using strict = hostWorker(nats.workerRole, "trusted");
  void strict.run();
  await eventually(async () => ((await client.listWorkers()).length === 1 ? true : undefined), "the worker to be live");
  const workItems = async () => (await nats.topology.jsm.streams.info(nats.topology.names.streams.work)).state.messages;
  const before = await workItems();

  const refused = await client.submit({ agent: "untrusted" }).catch((err: unknown) => err);
  expect(refused).toMatchObject({ code: ErrorCode.noSandbox });
  expect((refused as Error).message).toContain(`no live worker in pool default can run agent untrusted: ${strict.id}`);
  expect((refused as Error).message).toContain("mark the agent `trusted: true`");
  expect(await workItems()).toBe(before);
});

test("with no live worker the job waits; a worker that may not run it, alone, fails it saying what to change", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(untrusted);
  const { job } = await client.submit({ agent: "untrusted" });
  expect(job.state).toBe("queued");

  await using strict = hostWorker(nats.workerRole, "trusted");
  void strict.run();
  const final = await client.waitForJob(job.id);
  expect(final.state).toBe("failed");
  expect(final.error?.code).toBe(ErrorCode.noSandbox);
  expect(final.error?.message).toMatch(/offers host: .*mark the agent `trusted: true`.*host: always/);
});
