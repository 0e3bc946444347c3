/**
 * A dispatcher starts from a snapshot of the job index (issue 44): the settled jobs from the
 * snapshot, then the records written after it and the records of the jobs not settled, where it
 * read every record before. What it knows must be what a full read would have given it: every
 * job listed and counted, deletions after the snapshot seen, and a job still waiting acted on.
 * Against a real nats-server, each role on its own credential.
 */

import { type BoxcarClient, createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, type Topology } from "@boxcar/fabric";
import type { JobRecord } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsCluster, natsFixture, uniquePrefix } from "@boxcar/testing";
import { expect, test } from "vitest";
import { noting } from "./helpers/noting.js";

type Role = Parameters<typeof startDispatcher>[0];

/**
 * A first dispatcher (as `role`), writing a snapshot of the job index every 300 ms, and an agent
 * no worker serves, applied through `client`: its jobs wait until cancelled or expired.
 */
async function snapshotting(role: Role, client: BoxcarClient) {
  const dispatcher = await startDispatcher({ ...role, indexSnapshotIntervalMs: 300 });
  await client.applyAgent({ name: "idle", trusted: true, pool: "nobody", runtime: { sandbox: "host" }, command: ["true"] });
  return dispatcher;
}

/** `n` jobs of the idle agent, each cancelled: ended, settled. */
async function cancelledJobs(client: BoxcarClient, n: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const { job } = await client.submit({ agent: "idle", input: { i } });
    await client.cancelJob(job.id);
    ids.push(job.id);
  }
  return ids;
}

/** Until a snapshot covers every job the bucket holds now. */
async function snapshotted(topology: Topology): Promise<void> {
  const upTo = await lastSeq(topology);
  const store = await topology.jobIndex();
  const newest = async () => Math.max(0, ...(await store.list()).map((info) => Number(info.metadata?.seq) || 0));
  await eventually(async () => ((await newest()) >= upTo ? true : undefined), "a snapshot covering every job");
}

async function lastSeq(topology: Topology): Promise<number> {
  return (await topology.jsm.streams.info(`KV_${topology.names.buckets.jobs}`)).state.last_seq;
}

/** Every job the bucket holds, by id. */
async function stored(nats: NatsFixture): Promise<string[]> {
  const keys: string[] = [];
  for await (const key of await nats.topology.jobs.keys()) keys.push(key);
  return keys.sort();
}

test("a dispatcher started from the job index's snapshot lists and counts what the bucket holds, sees deletions after it, and expires a job that waited through it", async () => {
  await using nats = await natsFixture();
  const client = createClient(nats.topology);
  const first = await snapshotting(nats.dispatcherRole, client);
  const cancelled = await cancelledJobs(client, 120);
  // Not settled when the snapshot is cut: waiting, one to expire 6 s after it was queued, one to end after the snapshot.
  const { job: waiting } = await client.submit({ agent: "idle", queueTimeout: "6s" });
  const { job: endsAfter } = await client.submit({ agent: "idle", queueTimeout: "6s" });
  await snapshotted(nats.topology);
  const template = (await nats.topology.jobStore.read(cancelled[0] as string))?.record as JobRecord;
  await first.close();

  // After the snapshot, with no dispatcher running: ten deleted (their markers), five more ended.
  for (const id of cancelled.slice(0, 10)) await nats.topology.jobs.delete(id);
  const later = Array.from({ length: 5 }, (_, i) => `zzzlater${i}`);
  for (const id of later) await nats.topology.jobStore.create({ record: { ...template, id } });
  const cancelledAt = new Date().toISOString();
  await nats.topology.jobs.put(endsAfter.id, JSON.stringify({ ...endsAfter, state: "cancelled", finishedAt: cancelledAt }));

  const lines: string[] = [];
  const second = await startDispatcher({ ...nats.dispatcherRole, logger: noting(lines) });
  try {
    expect(lines).toContain("info the job index starts from a snapshot");
    const counts = await client.countJobs();
    expect(counts.counts.cancelled).toBe(120 - 10 + 5 + 1);
    const listed: string[] = [];
    for (let page = await client.listJobs({ limit: 100 }); ; page = await client.listJobs({ limit: 100, after: page.next })) {
      listed.push(...page.jobs.map((j) => j.id));
      if (!page.next) break;
    }
    expect(listed.sort()).toEqual(await stored(nats));
    expect(listed).not.toContain(cancelled[0]);
    expect(listed).toContain(later[0]);
    // Its record was read again at the start, and shown to the expiry sweep.
    await eventually(async () => ((await client.getJob(waiting.id)).state === "expired" ? true : undefined), "the waiting job to expire");
    expect((await client.countJobs()).counts.queued).toBe(0);
    // The one that ended after the snapshot is as its last record says, not expired.
    expect((await client.getJob(endsAfter.id)).state).toBe("cancelled");
  } finally {
    await second.close();
  }
}, 60_000);

test("a snapshot whose jobs are mostly still waiting is passed over: reading their records one by one would be slower than reading every record", async () => {
  await using nats = await natsFixture();
  const client = createClient(nats.topology);
  const first = await snapshotting(nats.dispatcherRole, client);
  const [ended] = await cancelledJobs(client, 1);
  const waiting = await Promise.all([1, 2, 3].map(async () => (await client.submit({ agent: "idle" })).job.id));
  await snapshotted(nats.topology);
  await first.close();

  const lines: string[] = [];
  const second = await startDispatcher({ ...nats.dispatcherRole, logger: noting(lines) });
  try {
    expect(lines).toContain("info the job index starts by reading every job record: 3 of its 4 jobs are not settled");
    expect((await client.listJobs()).jobs.map((j) => j.id).sort()).toEqual([ended, ...waiting].sort());
  } finally {
    await second.close();
  }
}, 60_000);

test("a snapshot that is not one is passed over, every record read instead; a worker's credential can neither read nor write the snapshots", async () => {
  await using nats = await natsFixture();
  const client = createClient(nats.topology);
  const first = await snapshotting(nats.dispatcherRole, client);
  const [job] = await cancelledJobs(client, 1);
  await snapshotted(nats.topology);
  await first.close();
  // Bytes in its place, named as a newer snapshot of the same bucket.
  const store = await nats.topology.jobIndex();
  const newest = (await store.list()).at(-1);
  const metadata = { ...newest?.metadata, seq: String(await lastSeq(nats.topology)) };
  await store.putBlob({ name: "jobs-9999999999999999", metadata }, new TextEncoder().encode("not an index"));

  const lines: string[] = [];
  const second = await startDispatcher({ ...nats.dispatcherRole, logger: noting(lines) });
  try {
    expect(lines).toContain("warn could not start from the job index's snapshot; reading every job record instead");
    expect((await client.listJobs()).jobs.map((j) => j.id)).toEqual([job]);
  } finally {
    await second.close();
  }

  // The attack: a worker poisons what dispatchers start from, or reads it.
  const worker = nats.workerRole.topology;
  await expect(worker.jobIndex()).rejects.toThrow(/cannot be opened/);
  await expect(worker.js.publish(`$O.${nats.topology.names.buckets.jobIndex}.C.forged`, "x")).rejects.toThrow(/Permissions Violation/i);
  await expect(worker.jsm.streams.info(`OBJ_${nats.topology.names.buckets.jobIndex}`)).rejects.toThrow(/Permissions Violation/i);
}, 60_000);

test("on a three-server cluster, with 3 replicas (no direct gets), a dispatcher starts from the snapshot and sees the deletions after it", async () => {
  await using cluster = await natsCluster(3);
  const nc = await cluster.connect();
  const topology = await openTopology(nc, { prefix: uniquePrefix(), replicas: 3 });
  try {
    expect((await topology.jsm.streams.info(`KV_${topology.names.buckets.jobs}`)).config.allow_direct).toBe(false);
    const client = createClient(topology);
    const first = await snapshotting({ topology }, client);
    const ids = await cancelledJobs(client, 20);
    await snapshotted(topology);
    await first.close();
    for (const id of ids.slice(0, 3)) await topology.jobs.delete(id);

    const lines: string[] = [];
    const second = await startDispatcher({ topology, logger: noting(lines) });
    try {
      expect(lines).toContain("info the job index starts from a snapshot");
      expect((await client.countJobs()).counts.cancelled).toBe(17);
      expect((await client.listJobs({ limit: 100 })).jobs.map((j) => j.id).sort()).toEqual(ids.slice(3).sort());
    } finally {
      await second.close();
    }
  } finally {
    await nc.close();
  }
}, 240_000); // natsCluster may start the cluster again
