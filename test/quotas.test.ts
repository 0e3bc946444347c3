/**
 * A user's quota counts every job of theirs, however it comes into being (issue 35): a submit, an
 * intake message, a workflow start and each of its fan-out's jobs, a handoff, a schedule's tick and
 * a retry of a dead job. Against a secured nats-server, a dispatcher and a host worker.
 */

import { ErrorCode, isTerminal, type JobRecord } from "@boxcar/protocol";
import { eventually } from "@boxcar/testing";
import { expect, test } from "vitest";
import { securedSystem } from "./helpers/secured.js";

const host = { trusted: true, runtime: { sandbox: "host" as const } };

test("with a quota of no jobs waiting, every way a user's job comes into being is refused quota_exceeded, and nothing of it is kept; an admin's are not", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  await admin.client.applyAgent({ name: "quick", ...host, command: "true" });
  await admin.client.applyAgent({ name: "dies", ...host, command: "exit 3", retry: { maxAttempts: 2, delay: "10ms" } });
  // Hands off once it sees the go file (the quota is set by then).
  await admin.client.applyAgent({
    name: "hands",
    ...host,
    command: `while [ ! -e "$BOXCAR_SIGNALS_DIR"/0001-go.json ]; do sleep 0.05; done; printf '{"handoff":{"to":"quick","input":1}}' > "$BOXCAR_RESULT_FILE"`,
    handoffs: ["quick"],
  });

  // Made before the quota: a run with an idempotency key, a dead job, and a running job that will hand off.
  const keyed = { workflow: { name: "keyed", steps: [{ name: "one", agent: "quick" }] }, input: null, idempotencyKey: "once" };
  const first = await alice.client.startRun(keyed);
  const dead = await alice.client.waitForJob((await alice.client.submit({ agent: "dies" })).job.id);
  expect(dead.state).toBe("dead");
  const handing = (await alice.client.submit({ agent: "hands" })).job;
  await eventually(async () => ((await alice.client.getJob(handing.id)).state === "running" ? true : undefined), "the handing job to run");

  await admin.client.setPolicy({ quotas: { default: { queued: 0 } } });
  const refused = { code: ErrorCode.quotaExceeded, message: expect.stringContaining("alice has 0 jobs queued and a quota of 0") };
  const count = async () => (await alice.client.countJobs()).total; // a submitter counts its own
  const before = await count();

  // A submit.
  await expect(alice.client.submit({ agent: "quick" })).rejects.toMatchObject(refused);
  // A workflow start, with a step fanning out.
  const fanOut = { name: "fan", steps: [{ name: "each", agent: "quick", forEach: "{{ input }}", input: "{{ item }}" }] };
  await expect(alice.client.startRun({ workflow: fanOut, input: [1, 2, 3] })).rejects.toMatchObject(refused);
  // The same start sent again (its key's run exists) gets that run back: no new job comes of it.
  expect(await alice.client.startRun(keyed)).toMatchObject({ duplicate: true, run: { id: first.run.id } });
  // A retry of a dead job.
  await expect(alice.client.retryJob(dead.id)).rejects.toMatchObject(refused);
  expect((await alice.client.getJob(dead.id)).state).toBe("dead");
  // An intake message for alice (only an admin may publish one): recorded rejected, saying why.
  admin.nc.publish(admin.names.subjects.submit("alice", "quick"), JSON.stringify({ input: "via intake" }));
  const intake = await eventually(async () => {
    const { jobs } = await alice.client.listJobs({ agent: "quick", state: "rejected" });
    return jobs.find((j) => j.error?.code === ErrorCode.quotaExceeded);
  }, "the intake message to be rejected");
  expect(intake.error?.message).toContain("quota of 0");
  // A schedule's tick: recorded rejected.
  await alice.client.createSchedule({ name: "every-second", cron: "* * * * * *", job: { agent: "quick" } });
  const tick = await eventually(async () => {
    const { jobs } = await alice.client.listJobs({ agent: "quick", state: "rejected" });
    return jobs.find((j) => j.schedule?.name === "every-second");
  }, "a tick to be rejected");
  expect(tick.error?.code).toBe(ErrorCode.quotaExceeded);
  await alice.client.deleteSchedule("every-second");
  // A handoff: refused, and the chain ends there.
  await alice.client.signalJob(handing.id, "go");
  const handed = await eventually(async () => {
    const job = await alice.client.getJob(handing.id);
    return job.handoff ? job : undefined;
  }, "the handoff to be decided");
  expect(handed.handoff).toMatchObject({ to: "quick", error: { code: ErrorCode.handoffRefused, message: refused.message } });
  expect(handed.handoff?.jobId).toBeUndefined();

  // Nothing but the two rejected records came of it.
  const after = await alice.client.listJobs({ limit: 1000 });
  expect(after.jobs.filter((j: JobRecord) => !isTerminal(j.state))).toEqual([]);
  expect(await count()).toBe(before + 2);
  expect(await admin.client.listRuns({ workflow: "fan" })).toEqual([]);

  // An admin has no quota; the same user under a larger one is admitted again (the check can pass).
  expect((await admin.client.submit({ agent: "quick" })).job.state).toBe("queued");
  await admin.client.setPolicy({ quotas: { default: { queued: 5 } } });
  expect((await alice.client.retryJob(dead.id)).state).toBe("queued");
});

test("a fan-out counts job by job: with room for three waiting jobs, three of twenty are admitted and the step fails on the fourth's refusal", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  // One at a time, its place held by an admin's job: alice's jobs all wait, counted as queued.
  await admin.client.applyAgent({ name: "one-at-a-time", ...host, command: "sleep 30", concurrency: { limit: 1 } });
  const holder = (await admin.client.submit({ agent: "one-at-a-time" })).job;
  await eventually(async () => ((await admin.client.getJob(holder.id)).state === "running" ? true : undefined), "the place to be held");
  await admin.client.setPolicy({ quotas: { default: { queued: 3 } } });

  const items = Array.from({ length: 20 }, (_, i) => i);
  const { run } = await alice.client.startRun({
    workflow: { name: "wide", steps: [{ name: "each", agent: "one-at-a-time", forEach: "{{ input }}", input: "{{ item }}" }] },
    input: items,
  });
  const ended = await alice.client.waitForRun(run.id);
  expect(ended.state).toBe("failed");
  const instances = ended.steps.each?.instances ?? [];
  const refusedOnes = instances.filter((i) => i.error?.code === ErrorCode.quotaExceeded);
  expect(refusedOnes.length).toBeGreaterThan(0);
  // At most three ever existed (each admitted one was cancelled with the run).
  const { jobs } = await alice.client.listJobs({ limit: 1000 });
  expect(jobs.filter((j) => j.chain?.run === run.id)).toHaveLength(3);
  await admin.client.cancelJob(holder.id);
});
