import { silentLogger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { natsTestServer } from "@boxcar/fabric/testing";
import { type JobRecord, PROTOCOL_VERSION } from "@boxcar/protocol";
import { expect, test } from "vitest";
import { IndexSnapshots } from "../jobs/index-snapshots.js";
import { JobIndex } from "../jobs/job-index.js";
import { PolicyBook } from "../limits/policy.js";
import { RetentionSweep } from "./retention.js";

// Against a real nats-server. The job-level behaviour (events, output, files) is in test/retention.test.ts.

/**
 * The job index's snapshots, as a dispatcher keeps them, covering the jobs bucket as far as
 * `cover()` (which writes one at the bucket's last sequence) last took them: at first, nowhere.
 */
function snapshotsOf(topology: Topology, index: JobIndex) {
  let at: number | undefined;
  const snapshots = new IndexSnapshots(
    topology,
    index,
    () => at,
    () => [],
    silentLogger,
    0,
    0,
  );
  const cover = async () => {
    at = (await topology.jsm.streams.info(`KV_${topology.names.buckets.jobs}`)).state.last_seq;
    expect(await snapshots.write()).toBe(true);
  };
  return { snapshots, cover };
}

/**
 * A retention sweep on `topology` as a dispatcher runs one, not started (the test makes the passes
 * itself): the index its watch keeps (the test shows it the records as it writes them), and the
 * index's snapshots (`cover()`). Stopped, with its policy, when disposed.
 */
async function sweeping(topology: Topology, opts?: ConstructorParameters<typeof RetentionSweep>[6]) {
  const policy = await PolicyBook.open(topology, silentLogger);
  const index = new JobIndex();
  const { snapshots, cover } = snapshotsOf(topology, index);
  const sweeper = new RetentionSweep(topology, policy, silentLogger, 3_600_000, index, snapshots, opts);
  return {
    index,
    sweeper,
    cover,
    async [Symbol.asyncDispose]() {
      await sweeper.stop();
      policy.close();
    },
  };
}

/** Past the default retention, 7 days. */
const eightDaysAgo = () => new Date(Date.now() - 8 * 24 * 3_600_000);

/** The record of job `id`, which succeeded at `at`. */
function ended(id: string, at: Date, extra: Partial<JobRecord> = {}): JobRecord {
  return {
    v: PROTOCOL_VERSION,
    id,
    agent: "noop",
    pool: "default",
    owner: "local",
    state: "succeeded",
    attempt: 1,
    createdAt: at.toISOString(),
    finishedAt: at.toISOString(),
    artifacts: [],
    history: [],
    ...extra,
  };
}
test("one sweep deletes every job past its retention, however many: batch after batch, and no other", async () => {
  await using nats = await natsTestServer();
  const topology = await nats.topology();
  await using sweep = await sweeping(topology);
  const { index, sweeper } = sweep;
  const old = eightDaysAgo();
  const records = [
    ...Array.from({ length: 1_200 }, (_, i) => ended(`old${i}`, old)),
    ...Array.from({ length: 5 }, (_, i) => ended(`new${i}`, new Date())),
  ];
  for (const record of records) {
    await topology.jobStore.create({ record: record });
    index.observe(record.id, record);
    sweeper.observe(record.id, record);
  }
  expect(await sweeper.run()).toBe(1_200);
  const left: string[] = [];
  for await (const key of await topology.jobs.keys()) left.push(key);
  expect(left.sort()).toEqual(["new0", "new1", "new2", "new3", "new4"]);
}, 60_000);

test("jobs kept because a job not yet ended uses their files do not hold back the jobs due behind them", async () => {
  await using nats = await natsTestServer();
  const topology = await nats.topology();
  await using sweep = await sweeping(topology);
  const { index, sweeper } = sweep;
  const old = eightDaysAgo().toISOString();
  const record = (id: string, state: JobRecord["state"], files: { path: string; object: string }[]): JobRecord => ({
    v: PROTOCOL_VERSION,
    id,
    agent: "noop",
    pool: "default",
    owner: "local",
    state,
    spec: { v: PROTOCOL_VERSION, agent: "noop", input: null, files, labels: {} },
    attempt: 1,
    createdAt: old,
    ...(state === "queued" ? {} : { finishedAt: old }),
    artifacts: [],
    history: [],
  });
  const shared = [{ path: "data.txt", object: "inputs/local/shared/data.txt" }];
  // More than a batch of ended jobs that share a file with a job still queued, then others.
  const records = [
    record("open", "queued", shared),
    ...Array.from({ length: 550 }, (_, i) => record(`kept${i}`, "succeeded", shared)),
    ...Array.from({ length: 100 }, (_, i) => record(`free${i}`, "succeeded", [])),
  ];
  for (const r of records) {
    await topology.jobStore.create({ record: r });
    index.observe(r.id, r);
    sweeper.observe(r.id, r);
  }
  expect(await sweeper.run()).toBe(100);
  const left: string[] = [];
  for await (const key of await topology.jobs.keys()) left.push(key);
  expect(left).toHaveLength(551);
  expect(left.some((k) => k.startsWith("free"))).toBe(false);
}, 60_000);

test("on a store filled to its last byte, a sweep deletes jobs that are nothing but their record: the records' bytes go before their delete markers are written", async () => {
  await using nats = await natsTestServer({ maxFileStore: 8 * 1024 ** 2 });
  const MiB = 1024 ** 2;
  const topology = await nats.topology({ streamLimits: { events: MiB, logs: MiB, dead: MiB, submit: MiB } });
  // Markers purged by the first pass after the one that wrote them, once a snapshot covers them.
  await using sweep = await sweeping(topology, { markerLingerMs: 0, ghostMs: 0 });
  const { index, sweeper, cover } = sweep;
  const ids = Array.from({ length: 20 }, (_, i) => `full${i}`);
  for (const id of ids) {
    const record = ended(id, eightDaysAgo(), { result: { exitCode: 0, signal: null, output: "r".repeat(20_000), durationMs: 1 } });
    await topology.jobStore.create({ record: record });
    index.observe(id, record);
    sweeper.observe(id, record);
  }
  // A dispatcher's watch, from before the store filled.
  const seen: string[] = [];
  const watch = await topology.jobs.watch({ include: "updates" });
  void (async () => {
    for await (const entry of watch) if (entry.operation === "DEL") seen.push(entry.key);
  })();
  // Every last byte taken, by a stream of another's.
  await topology.jsm.streams.add({ name: "FILL", subjects: ["fill"] });
  for (let size = 256 * 1024; size >= 1; )
    await topology.js.publish("fill", new Uint8Array(size)).catch(() => (size = Math.floor(size / 2)));
  await expect(topology.jobs.delete("full0")).rejects.toThrow(/insufficient resources/); // what a KV delete meets

  // The records are purged (no write would be taken: JetStream let the last one it took pass the
  // store's limit, by up to that message's size), then their markers written in the room the
  // batch left (so the watch forgets each job); the next pass purges the markers.
  expect(await sweeper.run()).toBe(20);
  const messages = async () => (await topology.jsm.streams.info(`KV_${topology.names.buckets.jobs}`)).state.messages;
  expect(await messages()).toBe(20);
  await expect.poll(() => seen.sort()).toEqual([...ids].sort());
  // Not before a snapshot of the job index covers them (it fits in the room the batch freed).
  expect(await sweeper.run()).toBe(0);
  expect(await messages()).toBe(20);
  await cover();
  expect(await sweeper.run()).toBe(0);
  expect(await messages()).toBe(0);
  watch.stop();
}, 60_000);

test("markers go once they have lingered, whoever wrote them, though a sweep and two cleans remove them at once", async () => {
  await using nats = await natsTestServer();
  const topology = await nats.topology();
  await using sweep = await sweeping(topology, { markerLingerMs: 0, ghostMs: 0 });
  const { sweeper, cover } = sweep;
  // Markers another dispatcher left (a stop cut its removal short) or a taken-back submit wrote,
  // as a dispatcher's watch shows them at its start.
  for (let i = 0; i < 40; i++) {
    await topology.jobs.put(`gone${i}`, "{}");
    await topology.jobs.delete(`gone${i}`);
    const marker = await topology.jobs.get(`gone${i}`);
    expect(marker?.operation).toBe("DEL");
    sweeper.observeMarker("jobs", `gone${i}`, marker?.revision as number);
  }
  const messages = async () => (await topology.jsm.streams.info(`KV_${topology.names.buckets.jobs}`)).state.messages;
  expect(await messages()).toBe(40);
  await cover();
  // One written after the snapshot stays: a dispatcher that starts from it sees that deletion only by its marker.
  await topology.jobs.put("later", "{}");
  await topology.jobs.delete("later");
  sweeper.observeMarker("jobs", "later", (await topology.jobs.get("later"))?.revision as number);
  // The passes take their shares of the markers; none is passed over.
  await Promise.all([sweeper.run(), sweeper.clean({ olderThan: 0 }), sweeper.clean({ olderThan: 0 })]);
  expect(await messages()).toBe(1);
  expect((await topology.jobs.get("later"))?.operation).toBe("DEL");
});

test("a job whose record is gone with no delete marker (a full store's purge whose dispatcher died, say) is taken out of the index once it has waited for one", async () => {
  await using nats = await natsTestServer();
  const topology = await nats.topology();
  await using sweep = await sweeping(topology, { markerLingerMs: 0, ghostMs: 0 });
  const { index, sweeper } = sweep;
  const old = eightDaysAgo();
  // The index has both (a snapshot gave them, say); the bucket only one, whose deletion the watch would show.
  index.observe("ghost", ended("ghost", old));
  await topology.jobStore.create({ record: ended("real", old) });
  index.observe("real", ended("real", old));
  await sweeper.run(); // finds the ghost gone and deletes the other (the watch not being there to show it)
  expect(index.has("ghost")).toBe(true);
  await sweeper.run();
  expect(index.has("ghost")).toBe(false);
  // The one it deleted itself is gone from the bucket; its marker, which a watch would show, is what takes it out.
  expect(await topology.jobStore.read("real")).toBeNull();
});
