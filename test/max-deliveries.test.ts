import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { Topology } from "@boxcar/fabric";
import { readStream } from "@boxcar/fabric/internal";
import { type BoxcarEvent, ErrorCode, JobRecord, WorkItem } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import type { JsMsg } from "@nats-io/jetstream";
import { afterEach, beforeEach, expect, test } from "vitest";

/** A short lease and two deliveries: JetStream gives up on a work item within seconds. */
const LEASE_MS = 1_000;
const MAX_DELIVERIES = 2;

let nats: NatsFixture;
let dispatchers: Dispatcher[];
let client: BoxcarClient;

beforeEach(async () => {
  nats = await natsFixture({ ackWaitMs: LEASE_MS, maxDeliveries: MAX_DELIVERIES });
  // Two dispatchers, each watching for given-up items: both receive every advisory.
  dispatchers = [await startDispatcher({ ...nats.dispatcherRole }), await startDispatcher({ ...nats.dispatcherRole })];
  client = createClient(nats.topology);
  await client.applyAgent({ name: "doomed", command: "echo ran", trusted: true, runtime: { sandbox: "host" } });
});
afterEach(async () => {
  for (const d of dispatchers ?? []) await d.close();
  await nats?.[Symbol.asyncDispose]();
});

/** Takes the next work item from the pool consumer as a worker would (and never acks it); null if none comes. */
async function pull(topology: Topology, expires = 10_000): Promise<JsMsg | null> {
  const consumer = await topology.js.consumers.get(topology.names.streams.work, topology.names.poolConsumer("default"));
  return consumer.next({ expires });
}

/** Claims the job for a worker that then crashes: the record says running, attempt n, on it. */
async function claimAndCrash(topology: Topology, jobId: string, workerId: string): Promise<void> {
  const entry = await topology.jobs.get(jobId);
  if (!entry) throw new Error(`no record for job ${jobId}`);
  const job = JobRecord.parse(entry.json());
  const running: JobRecord = { ...job, state: "running", attempt: job.attempt + 1, workerId, startedAt: new Date().toISOString() };
  await topology.jobs.update(jobId, JSON.stringify(running), entry.revision);
}

async function jobEvents(jobId: string): Promise<BoxcarEvent[]> {
  const events: BoxcarEvent[] = [];
  for await (const e of client.events(jobId)) events.push(e);
  return events;
}

async function workStreamHolds(seq: number): Promise<boolean> {
  return (await nats.topology.jsm.streams.getMessage(nats.topology.names.streams.work, { seq })) !== null;
}

test("a work item that keeps crashing its workers ends the job dead once JetStream gives up; nothing vanishes", async () => {
  const { job } = await client.submit({ agent: "doomed" });
  const seqs: number[] = [];
  for (const workerId of ["crashy-1", "crashy-2"]) {
    const msg = await pull(nats.topology);
    if (!msg) throw new Error("the work item was not delivered");
    expect(msg.info.deliveryCount).toBe(seqs.length + 1);
    seqs.push(msg.seq);
    await claimAndCrash(nats.topology, job.id, workerId);
  }
  expect(seqs[0]).toBe(seqs[1]);
  // JetStream notices a given-up item when it looks for the next one to deliver: another worker waits.
  const third = pull(nats.topology, 5_000);

  const dead = await eventually(async () => {
    const current = await client.getJob(job.id);
    return current.state === "dead" ? current : undefined;
  }, "the job to end dead");
  expect(dead).toMatchObject({
    state: "dead",
    attempt: 2,
    error: { code: ErrorCode.internal, message: expect.stringContaining(`JetStream gave up after ${MAX_DELIVERIES} deliveries`) },
    history: [expect.objectContaining({ attempt: 2, state: "failed", workerId: "crashy-2" })],
  });
  expect(dead.finishedAt).toBeDefined();

  // One outcome although both dispatchers received the advisory.
  const finals = (await jobEvents(job.id)).filter((e) => e.kind === "job" && ["succeeded", "failed", "dead"].includes(e.type));
  expect(finals).toEqual([expect.objectContaining({ type: "dead", state: "dead", message: dead.error?.message })]);

  const { names } = nats.topology;
  const kept = await eventually(async () => {
    const records: JobRecord[] = [];
    for await (const msg of readStream(nats.topology, names.streams.dead, names.subjects.dead("doomed")))
      records.push(JobRecord.parse(msg.json()));
    return records.length > 0 ? records : undefined;
  }, "the dead-letter record");
  expect(kept.map((r) => [r.id, r.state])).toEqual([[job.id, "dead"]]);

  await eventually(async () => ((await workStreamHolds(seqs[0]!)) ? undefined : true), "the work item to leave the work stream");
  expect((await nats.topology.jsm.streams.info(names.streams.work)).state.messages).toBe(0);
  expect(await third).toBeNull(); // and no worker got it a third time
});

test("a waiting job whose deliveries ran out without a failure (hand-backs, backoffs) is enqueued again, not buried", async () => {
  const { job } = await client.submit({ agent: "doomed" });
  const seqs = new Set<number | undefined>();
  for (let i = 0; i < MAX_DELIVERIES; i++) seqs.add((await pull(nats.topology))?.seq); // taken, never claimed nor acked
  const [seq] = seqs;
  expect(seqs.size).toBe(1);

  // A worker comes: JetStream gives up on the old item when it looks for one for it, and the
  // dispatchers put a fresh copy in its place, which the worker runs.
  await using worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  expect(await client.waitForJob(job.id)).toMatchObject({ state: "succeeded", attempt: 1 });
  expect(await workStreamHolds(seq!)).toBe(false);
  const info = await nats.topology.jsm.streams.info(nats.topology.names.streams.work);
  expect(info.state.last_seq).toBe(seq! + 1); // one fresh copy, although both dispatchers saw the advisory
  await eventually(
    async () => ((await nats.topology.jsm.streams.info(nats.topology.names.streams.work)).state.messages === 0 ? true : undefined),
    "the acked item to leave",
  );
});

test("items given up while no dispatcher listened are settled by the next dispatcher's sweep: the crashing job dead, the waiting one run", async () => {
  const crashing = (await client.submit({ agent: "doomed" })).job;
  const waiting = (await client.submit({ agent: "doomed" })).job;
  // No dispatcher hears the advisories: the advisory is a core NATS message, not stored.
  for (const d of dispatchers) await d.close();
  dispatchers = [];
  const seqs = new Map<string, number>();
  for (let delivery = 0; delivery < MAX_DELIVERIES * 2; delivery++) {
    const msg = await pull(nats.topology);
    if (!msg) throw new Error("a work item was not delivered");
    const { jobId } = WorkItem.parse(msg.json());
    seqs.set(jobId, msg.seq);
    if (jobId === crashing.id) await claimAndCrash(nats.topology, jobId, `crashy-${delivery}`);
  }
  expect([...seqs.keys()].sort()).toEqual([crashing.id, waiting.id].sort());
  // A waiting worker makes JetStream notice both items are used up; it gets neither.
  expect(await pull(nats.topology, 3_000)).toBeNull();
  const stateOf = async (id: string) => (await nats.topology.jobStore.read(id))?.record.state;
  expect([await stateOf(crashing.id), await stateOf(waiting.id)]).toEqual(["running", "queued"]);
  for (const seq of seqs.values()) expect(await workStreamHolds(seq)).toBe(true);

  dispatchers.push(await startDispatcher({ ...nats.dispatcherRole, givenUpIntervalMs: 200 }));
  await using worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  const dead = await eventually(async () => {
    const current = await client.getJob(crashing.id);
    return current.state === "dead" ? current : undefined;
  }, "the crashing job to end dead");
  expect(dead.error?.message).toContain(`JetStream gave up after ${MAX_DELIVERIES} deliveries`);
  expect(await client.waitForJob(waiting.id)).toMatchObject({ state: "succeeded", attempt: 1 });
  const finals = (await jobEvents(crashing.id)).filter((e) => e.kind === "job" && ["succeeded", "failed", "dead"].includes(e.type));
  expect(finals).toEqual([expect.objectContaining({ type: "dead", state: "dead" })]);
  for (const seq of seqs.values()) expect(await workStreamHolds(seq)).toBe(false);
  await eventually(
    async () => ((await nats.topology.jsm.streams.info(nats.topology.names.streams.work)).state.messages === 0 ? true : undefined),
    "the work stream to empty",
  );
});
