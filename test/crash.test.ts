import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { publishEvent } from "@boxcar/fabric/internal";
import { type BoxcarEvent, type JobRecord, JobSpec, PROTOCOL_VERSION } from "@boxcar/protocol";
import { eventually, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { exited, spawnBoxcar } from "./helpers/cli.js";
import { leasedSystem } from "./helpers/leased.js";

/** A short lease (ack wait) on the pool, so redelivery after a crash comes quickly. */
const LEASE_MS = 1_500;

const system = () => leasedSystem(LEASE_MS);

async function jobTypes(client: ReturnType<typeof createClient>, jobId: string): Promise<string[]> {
  const types: string[] = [];
  for await (const e of client.events(jobId)) if (e.kind === "job") types.push(`${e.type}:${e.attempt}`);
  return types;
}

test("a slow but alive worker keeps its lease: a job longer than the lease runs once", async () => {
  await using s = await system();
  // A worker process with default options: it must keep the job alive within the consumer's
  // lease. A second worker would take the job over if the lease lapsed.
  const worker = spawnBoxcar(s.nats.url, s.nats.topology.names.prefix, ["worker"]);
  try {
    await eventually(async () => ((await s.client.listWorkers()).length === 1 ? true : undefined), "the worker process to be live");
    await using _other = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()] });
    void _other.run();
    await s.client.applyAgent({ name: "slow", command: "sleep 5; echo done", trusted: true, runtime: { sandbox: "host" } });
    const { job } = await s.client.submit({ agent: "slow" });
    const final = await s.client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 1 });
    expect(await jobTypes(s.client, job.id)).toEqual(["accepted:0", "queued:0", "started:1", "succeeded:1"]);
  } finally {
    worker.kill("SIGTERM");
    await exited(worker);
  }
});

test("a worker killed mid-job (SIGKILL): the job is picked up again, runs again, and ends with exactly one outcome", async () => {
  await using s = await system();
  await s.client.applyAgent({
    name: "crashy",
    command: 'if [ "$BOXCAR_ATTEMPT" = 1 ]; then echo first; sleep 300; fi; echo "attempt $BOXCAR_ATTEMPT done"',
    trusted: true,
    runtime: { sandbox: "host" },
  });
  const doomed = spawnBoxcar(s.nats.url, s.nats.topology.names.prefix, ["worker"]);
  const { job } = await s.client.submit({ agent: "crashy" });
  // Mid-job: its start is stored (the claim is written just before; a kill between the two, seen
  // in CI, leaves an attempt with no `started` event).
  await eventually(async () => ((await jobTypes(s.client, job.id)).includes("started:1") ? true : undefined), "the first attempt to start");
  doomed.kill("SIGKILL");
  await exited(doomed);

  await using survivor = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()] });
  void survivor.run();
  const final = await s.client.waitForJob(job.id);
  expect(final).toMatchObject({ state: "succeeded", attempt: 2, workerId: survivor.id });
  const types = await jobTypes(s.client, job.id);
  expect(types).toEqual(["accepted:0", "queued:0", "started:1", "started:2", "succeeded:2"]);
  expect(types.filter((t) => /^(succeeded|failed|timed_out|cancelled|dead):/.test(t))).toHaveLength(1);
});

test("a job whose first attempt was cut short by a crashed worker and whose second failed ends dead, saying which was which; the takeover is recorded", async () => {
  await using s = await system();
  await s.client.applyAgent({
    name: "crash-then-fail",
    command: 'if [ "$BOXCAR_ATTEMPT" = 1 ]; then sleep 300; fi; echo "no luck" >&2; exit 3',
    trusted: true,
    runtime: { sandbox: "host" },
    retry: { maxAttempts: 2, delay: "10ms" },
  });
  const doomed = spawnBoxcar(s.nats.url, s.nats.topology.names.prefix, ["worker"]);
  const { job } = await s.client.submit({ agent: "crash-then-fail" });
  await eventually(async () => ((await jobTypes(s.client, job.id)).includes("started:1") ? true : undefined), "the first attempt to start");
  const first = await s.client.getJob(job.id);
  doomed.kill("SIGKILL");
  await exited(doomed);

  await using survivor = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()] });
  void survivor.run();
  const final = await s.client.waitForJob(job.id);
  expect(final).toMatchObject({
    state: "dead",
    attempt: 2,
    takeover: { attempt: 1, workerId: first.workerId, sandbox: first.sandbox?.id, stopped: "lease" },
  });
  const events: string[] = [];
  for await (const e of s.client.events(job.id)) if (e.kind === "job" && e.type === "dead") events.push(e.message ?? "");
  expect(events).toEqual([expect.stringContaining("all 2 attempts ended without success: 1 failed, 1 cut short")]);
});

test("a zombie attempt that finishes late cannot overwrite the outcome of a newer attempt", async () => {
  await using s = await system();
  await s.client.applyAgent({
    name: "zombie",
    command: `if [ "$BOXCAR_ATTEMPT" = 1 ]; then sleep 4; fi; printf '{"output":"attempt %s"}' "$BOXCAR_ATTEMPT" > "$BOXCAR_RESULT_FILE"`,
    trusted: true,
    runtime: { sandbox: "host" },
  });
  const stale = spawnBoxcar(s.nats.url, s.nats.topology.names.prefix, ["worker"]);
  try {
    const { job } = await s.client.submit({ agent: "zombie" });
    await eventually(async () => ((await s.client.getJob(job.id)).state === "running" ? true : undefined), "attempt 1 to run");
    stale.kill("SIGSTOP"); // frozen: it stops renewing its lease, and its agent keeps running

    await using fresh = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()] });
    void fresh.run();
    const final = await s.client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 2, workerId: fresh.id, result: { output: "attempt 2" } });

    stale.kill("SIGCONT"); // the zombie wakes up; its attempt 1 is past its lease and owned by nobody
    await eventually(
      async () => (/another attempt owns the job|the job ended elsewhere/.test(stale.output()) ? true : undefined),
      "the zombie to notice it was fenced",
    );
    expect(await s.client.getJob(job.id)).toEqual(final);
    const terminal = (await jobTypes(s.client, job.id)).filter((t) => /^(succeeded|failed|timed_out|cancelled|dead):/.test(t));
    expect(terminal).toEqual(["succeeded:2"]);
  } finally {
    stale.kill("SIGCONT");
    stale.kill("SIGTERM");
    await exited(stale);
  }
});

test("a worker that died between writing a job's end and publishing its event: the next to get the work item publishes it, dated when the job ended", async () => {
  await using s = await system();
  await s.client.applyAgent({ name: "quick", command: "echo ran", trusted: true, runtime: { sandbox: "host" } });
  const { job } = await s.client.submit({ agent: "quick" });
  // What the dead worker left: the record ended (claimed and finished), no event, the work item unacknowledged.
  const entry = await s.nats.topology.jobs.get(job.id);
  const queued = entry?.json<JobRecord>() as JobRecord;
  const finishedAt = new Date(Date.now() - 3_000).toISOString();
  const ended: JobRecord = { ...queued, state: "succeeded", attempt: 1, workerId: "w-gone", startedAt: finishedAt, finishedAt };
  await s.nats.topology.jobs.update(job.id, JSON.stringify(ended), entry?.revision as number);

  await using worker = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  const outcome = await eventually(async () => {
    for await (const e of s.client.events(job.id)) if (e.kind === "job" && e.type === "succeeded") return e;
    return undefined;
  }, "the outcome event to be published again");
  expect(outcome).toMatchObject({ attempt: 1, state: "succeeded", at: finishedAt, workerId: "w-gone" });
  // Not run again.
  expect(await s.client.getJob(job.id)).toEqual(ended);
});

test("an admission cut short by a dispatcher crash (record written, work item not) is finished by a dispatcher; a job that only waits is not doubled", async () => {
  await using s = await system();
  await s.client.applyAgent({ name: "quick", command: "echo ran >> runs.txt; cat runs.txt", trusted: true, runtime: { sandbox: "host" } });
  // What `admit` leaves when its dispatcher dies between the record and the work item.
  const now = new Date().toISOString();
  const orphan: JobRecord = {
    v: PROTOCOL_VERSION,
    id: "0orphanedadmission1",
    agent: "quick",
    pool: "default",
    state: "queued",
    spec: JobSpec.parse({ agent: "quick" }),
    attempt: 0,
    createdAt: now,
    queuedAt: now,
    artifacts: [],
    history: [],
    attemptsAllowed: 1,
  };
  // Every work item published, stored or dropped as a duplicate, as a plain subscriber sees it.
  const published: string[] = [];
  const prefix = s.nats.topology.names.prefix;
  const tap = s.nats.nc.subscribe(`${prefix}.work.>`, {
    callback: (_err, msg) => {
      published.push(msg.json<{ jobId: string }>().jobId);
    },
  });
  await s.nats.nc.flush();
  await s.nats.topology.jobs.create(orphan.id, JSON.stringify(orphan));
  // A job properly admitted that waits longer than the sweeper's grace: its dispatcher stored its
  // work item, so it does not publish it again (under a backlog that would double every job's cost).
  const { job: waiting } = await s.client.submit({ agent: "quick" });
  await new Promise((r) => setTimeout(r, 7_000));
  tap.unsubscribe();
  expect(published.sort()).toEqual([orphan.id, waiting.id].sort());

  await using worker = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  expect(await s.client.waitForJob(orphan.id)).toMatchObject({ state: "succeeded", attempt: 1 });
  expect(await s.client.waitForJob(waiting.id)).toMatchObject({ state: "succeeded", attempt: 1 });
  await new Promise((r) => setTimeout(r, 1_000));
  expect(await jobTypes(s.client, waiting.id)).toEqual(["accepted:0", "queued:0", "started:1", "succeeded:1"]);
  const work = await s.nats.topology.jsm.streams.info(s.nats.topology.names.streams.work);
  expect(work.state.messages).toBe(0);
});

test("with two dispatchers and jobs that wait, no dispatcher publishes another's work item again", async () => {
  await using s = await system();
  await using _second = await startDispatcher({ ...s.nats.dispatcherRole });
  await s.client.applyAgent({ name: "quick", command: "echo ran", trusted: true, runtime: { sandbox: "host" } });
  const published: string[] = [];
  const tap = s.nats.nc.subscribe(`${s.nats.topology.names.prefix}.work.>`, {
    callback: (_err, msg) => {
      published.push(msg.json<{ jobId: string }>().jobId);
    },
  });
  await s.nats.nc.flush();
  // Requests go to either dispatcher; each job waits (no worker) past the sweeper's 5 s grace.
  const ids = [];
  for (let i = 0; i < 10; i++) ids.push((await s.client.submit({ agent: "quick", input: i })).job.id);
  await new Promise((r) => setTimeout(r, 7_000));
  tap.unsubscribe();
  expect(published.sort()).toEqual(ids.sort());
});

test("a job recorded queued long ago without a work item (no dispatcher ran for longer than the duplicate window) is enqueued again, once; a waiting job is not doubled", async () => {
  const nats = await natsFixture({ ackWaitMs: LEASE_MS });
  await using _nats = nats;
  await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole, recoveryIntervalMs: 300 });
  const client = createClient(nats.topology);
  await client.applyAgent({ name: "quick", command: "echo ran", trusted: true, runtime: { sandbox: "host" } });
  // What `admit` left when its dispatcher died between the record and the work item, ten
  // minutes ago: past the stream's duplicate window, so the admission sweeper leaves it alone.
  const then = new Date(Date.now() - 10 * 60_000).toISOString();
  const orphan: JobRecord = {
    v: PROTOCOL_VERSION,
    id: "0orphanedlongago001",
    agent: "quick",
    pool: "default",
    state: "queued",
    spec: JobSpec.parse({ agent: "quick" }),
    attempt: 0,
    createdAt: then,
    queuedAt: then,
    artifacts: [],
    history: [],
    attemptsAllowed: 1,
  };
  await nats.topology.jobs.create(orphan.id, JSON.stringify(orphan));
  const { job: waiting } = await client.submit({ agent: "quick" });
  const work = async () => (await nats.topology.jsm.streams.info(nats.topology.names.streams.work)).state.messages;
  await eventually(async () => ((await work()) === 2 ? true : undefined), "the orphan's work item");
  await new Promise((r) => setTimeout(r, 1_500)); // several more looks: nothing more is enqueued
  expect(await work()).toBe(2);

  await using worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  expect(await client.waitForJob(orphan.id)).toMatchObject({ state: "succeeded", attempt: 1 });
  expect(await client.waitForJob(waiting.id)).toMatchObject({ state: "succeeded", attempt: 1 });
});

test("a job whose worker wrote the outcome but died before its event: the next delivery publishes the event, once", async () => {
  await using s = await system();
  await s.client.applyAgent({ name: "blocker", command: "sleep 2", trusted: true, runtime: { sandbox: "host" } });
  await s.client.applyAgent({ name: "quick", command: "true", trusted: true, runtime: { sandbox: "host" } });
  await using worker = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()], concurrency: 1 });
  void worker.run();
  const { job: blocking } = await s.client.submit({ agent: "blocker" });
  await eventually(async () => ((await s.client.getJob(blocking.id)).state === "running" ? true : undefined), "the worker to be busy");
  const { job } = await s.client.submit({ agent: "quick" });
  // What a worker leaves when it dies right after writing the outcome: the record final, no event, the item not acked.
  const entry = await s.nats.topology.jobs.get(job.id);
  const ended = {
    ...(entry?.json() as JobRecord),
    state: "succeeded",
    attempt: 1,
    workerId: "w-gone",
    finishedAt: new Date().toISOString(),
  };
  await s.nats.topology.jobs.update(job.id, JSON.stringify(ended), entry?.revision ?? 0);

  await s.client.waitForJob(blocking.id);
  const finalEvents = async () => {
    const events = [];
    for await (const e of s.client.events(job.id)) if (e.kind === "job" && e.type === "succeeded") events.push(e);
    return events;
  };
  const published = await eventually(async () => ((await finalEvents()).length > 0 ? finalEvents() : undefined), "the outcome event");
  expect(published).toEqual([expect.objectContaining({ attempt: 1, workerId: "w-gone", state: "succeeded" })]);
  // Published again by someone else (a second copy of the item, a retried publish): still one.
  await publishEvent(s.nats.topology, { ...published[0], at: new Date().toISOString() } as BoxcarEvent);
  expect(await finalEvents()).toHaveLength(1);
  const work = await s.nats.topology.jsm.streams.info(s.nats.topology.names.streams.work);
  expect(work.state.messages).toBe(0);
});
