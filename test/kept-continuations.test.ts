/**
 * A job the system submits itself (a handoff's next job, a workflow step's) that a full store
 * kept (`accepted_pending`: its work item refused for want of storage, its record not taken
 * back) counts as admitted: the chain or run names it and waits for it, and it runs once the
 * dispatchers' sweep publishes its work item. Taken for a refusal, it ran all the same, unknown
 * to its chain or run.
 *
 * That moment (the store filling between a record and its work item, and the take-back failing)
 * cannot be brought about on purpose against a real store, so the dispatcher's own connection
 * meets it: its next work item's publish is refused as JetStream refuses one on a full store
 * (10047), and the take-back that follows finds the record changed. Everything else is real.
 */

import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import type { Topology } from "@boxcar/fabric";
import { eventually, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { JetStreamApiError } from "@nats-io/jetstream";
import { expect, test } from "vitest";

/** Arms the store filling once, for `topology`'s next work item: its publish refused, its take-back failing. */
function storeFillsOnce(topology: Topology): { arm(): void; fired(): boolean; kept(): string | undefined } {
  const work = `${topology.names.prefix}.work.`;
  let armed = false;
  let fired = false;
  let kept: string | undefined;
  const publish = topology.js.publish.bind(topology.js);
  topology.js.publish = (subject, ...rest) => {
    if (armed && subject.startsWith(work)) {
      armed = false;
      fired = true;
      kept = rest[1]?.msgID; // a work item's message id is its job's
      return Promise.reject(new JetStreamApiError({ code: 503, err_code: 10047, description: "insufficient storage resources available" }));
    }
    return publish(subject, ...rest);
  };
  const withdraw = topology.jobStore.withdraw.bind(topology.jobStore);
  topology.jobStore.withdraw = async (handle) => (fired ? false : withdraw(handle));
  return {
    arm: () => {
      armed = true;
    },
    fired: () => fired,
    kept: () => kept,
  };
}

async function system() {
  const nats = await natsFixture();
  const store = storeFillsOnce(nats.dispatcherRole.topology);
  const dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  const worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  const quick = { trusted: true, runtime: { sandbox: "host" as const } };
  await client.applyAgent({ name: "next", command: ["sh", "-c", "echo next ran"], ...quick });
  await client.applyAgent({
    name: "first",
    command: ["sh", "-c", `printf '{"handoff":{"to":"next"}}' > "$BOXCAR_RESULT_FILE"`],
    handoffs: ["next"],
    ...quick,
  });
  return {
    nats,
    store,
    client,
    async [Symbol.asyncDispose]() {
      await worker[Symbol.asyncDispose]();
      await dispatcher.close();
      await nats[Symbol.asyncDispose]();
    },
  };
}

test("a handoff's next job kept by a full store is the chain's next job: the handoff names it, and it runs once", async () => {
  await using s = await system();
  const { job: first } = await s.client.submit({ agent: "first" });
  s.store.arm(); // the next work item published is the handoff's
  const last = await s.client.waitForChain(first.id);
  expect(s.store.fired()).toBe(true);
  expect(last).toMatchObject({ agent: "next", state: "succeeded", attempt: 1 });
  const handoff = (await s.client.getJob(first.id)).handoff;
  expect(handoff).toEqual({ to: "next", jobId: last.id });
  const nexts = (await s.client.listJobs({ agent: "next" })).jobs;
  expect(nexts.map((j) => j.id)).toEqual([last.id]);
});

test("a workflow step's job kept by a full store is the step's job: the run waits for it and succeeds", async () => {
  await using s = await system();
  s.store.arm();
  const { run } = await s.client.startRun({ workflow: { name: "kept", steps: [{ name: "only", agent: "next" }] } });
  const finished = await s.client.waitForRun(run.id);
  expect(s.store.fired()).toBe(true);
  expect(finished.state).toBe("succeeded");
  const jobs = (await s.client.listJobs({ agent: "next" })).jobs;
  expect(jobs).toHaveLength(1);
  expect(finished.steps.only?.instances.map((i) => [i.jobs, i.state])).toEqual([[[jobs[0]?.id], "succeeded"]]);
});

test("a schedule's job kept by a full store is the tick's job, not a refusal: the schedule notes no error, and the job runs", async () => {
  await using s = await system();
  s.store.arm(); // the tick's work item
  // One tick, three seconds from now (at that second of each minute).
  const cron = `${(new Date().getUTCSeconds() + 3) % 60} * * * * *`;
  await s.client.createSchedule({ name: "kept", cron, timezone: "UTC", job: { agent: "next" } });
  const schedule = await eventually(async () => {
    const found = await s.client.getSchedule("kept");
    return found.state.fired >= 1 ? found : undefined;
  }, "the tick");
  await s.client.pauseSchedule("kept");
  expect(s.store.kept()).toBeDefined();
  expect(schedule.state).toMatchObject({ jobId: s.store.kept(), fired: 1 });
  expect(schedule.state.lastError).toBeUndefined();
  expect(await s.client.waitForJob(s.store.kept() as string)).toMatchObject({ agent: "next", state: "succeeded" });
});
