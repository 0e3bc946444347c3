/**
 * Concurrency limits per pool, and over all values of an agent's key (issue 21, part 1): the
 * system policy's `pools.<pool>.concurrency` caps a pool's jobs whatever their agent, and an
 * agent's `concurrency.total` caps its jobs over every value of its key, against a real
 * nats-server and real workers. What runs at once is read from the jobs' own events as they come.
 */

import { type BoxcarClient, createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode, type JobRecord } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";
import { runningSet } from "./helpers/running-set.js";

/** A nats-server, two dispatchers (sweeping every half second), a client, and two host workers of 4 slots. */
async function system(): Promise<{ nats: NatsFixture; client: BoxcarClient } & AsyncDisposable> {
  const nats = await natsFixture();
  const role = { ...nats.dispatcherRole, givenUpIntervalMs: 500 };
  const dispatchers = [await startDispatcher(role), await startDispatcher(role)];
  const workers = [0, 1].map(() => createWorker({ ...nats.workerRole, concurrency: 4, providers: [createHostSandboxProvider()] }));
  for (const w of workers) void w.run();
  return {
    nats,
    client: createClient(nats.topology),
    async [Symbol.asyncDispose]() {
      for (const w of workers) await w.close();
      for (const d of dispatchers) await d.close();
      await nats[Symbol.asyncDispose]();
    },
  };
}

test("a pool limited to 3 runs at most 3 of its jobs whatever their agent, and an agent limited to 1 per key and 2 in all holds to both; waiting jobs say which limit they wait for", async () => {
  await using s = await system();
  const { nats, client } = s;
  const prefix = nats.topology.names.prefix;
  await client.setPolicy({ pools: { default: { concurrency: 3 } } });
  await client.applyAgent({ name: "free", command: "sleep 0.3", trusted: true, runtime: { sandbox: "host" } });
  await client.applyAgent({
    name: "capped",
    command: "sleep 0.3",
    trusted: true,
    runtime: { sandbox: "host" },
    concurrency: { limit: 1, key: "input.k", total: 2 },
  });
  const groups = new Map<string, string[]>();
  const seen = runningSet(nats.nc, prefix, (id) => groups.get(id) ?? []);
  try {
    const jobs: JobRecord[] = [];
    for (let i = 0; i < 24; i++) {
      const k = `k${Math.floor(i / 2) % 4}`;
      const { job } = i % 2 === 0 ? await client.submit({ agent: "free" }) : await client.submit({ agent: "capped", input: { k } });
      groups.set(job.id, i % 2 === 0 ? ["pool"] : ["pool", "capped", `capped.${k}`]);
      jobs.push(job);
    }
    // 8 slots, but 3 places in the pool: the rest wait, each where it found no place.
    const pool = jobs.filter((j) => j.concurrency?.waiting && j.concurrency.place === "=pool.default");
    expect(pool.length).toBeGreaterThan(0);
    const waitsInPool = pool.at(-1) as JobRecord;
    const status = await boxcar(nats.url, prefix, ["status", waitsInPool.id]);
    expect(status.stdout).toContain("waits     for a place under pool default's concurrency limit");

    const done = await Promise.all(jobs.map((j) => client.waitForJob(j.id)));
    expect(done.filter((j) => j.state !== "succeeded").map((j) => [j.id, j.state, j.error?.code])).toEqual([]);
    expect(seen.most.get("pool")).toBe(3);
    expect(seen.most.get("capped")).toBe(2);
    expect([0, 1, 2, 3].map((k) => seen.most.get(`capped.k${k}`))).toEqual([1, 1, 1, 1]);
    // A capped job takes its key's place, then one over all keys, then the pool's.
    const capped = done.find((j) => j.agent === "capped") as JobRecord;
    expect(capped.concurrency?.places).toEqual([expect.stringMatching(/^capped\.[0-9a-f]{32}$/), "capped.=total", "=pool.default"]);
    const messages: string[] = [];
    for await (const e of client.events(waitsInPool.id)) if (e.kind === "job" && e.message) messages.push(`${e.type}: ${e.message}`);
    expect(messages[0]).toBe("queued: waits for a place under pool default's concurrency limit");
    expect(messages).toContain(
      waitsInPool.agent === "free"
        ? "released: given a place under pool default's concurrency limit"
        : "released: given a place under each of its concurrency limits",
    );

    // Every place is free again: with the pool's limit gone, 8 start at once.
    await client.setPolicy({});
    const free = await Promise.all(Array.from({ length: 8 }, () => client.submit({ agent: "free" })));
    expect(free.filter(({ job }) => job.concurrency !== undefined)).toEqual([]);
    const entries = await nats.topology.limits();
    for (const key of ["=places.=pool.default", "=places.capped.=total"]) {
      expect(JSON.parse((await entries.get(key))?.string() ?? "{}").holding, key).toEqual({});
    }
  } finally {
    seen.stop();
  }
}, 60_000);

test("drop-new refuses a job when its agent's total is spent, and lets go of the place its key gave it", async () => {
  await using s = await system();
  const { client } = s;
  await client.applyAgent({
    name: "one-in-all",
    command: "sleep 1",
    trusted: true,
    runtime: { sandbox: "host" },
    concurrency: { limit: 1, key: "input.k", total: 1, strategy: "drop-new" },
  });
  const first = (await client.submit({ agent: "one-in-all", input: { k: "a" } })).job;
  await expect(client.submit({ agent: "one-in-all", input: { k: "b" } })).rejects.toMatchObject({
    code: ErrorCode.conflict,
    message: expect.stringContaining("at most 1 jobs at once in all"),
  });
  expect(await client.waitForJob(first.id)).toMatchObject({ state: "succeeded" });
  // Key b's place went back with the refusal: its next job takes it.
  await eventually(async () => {
    const next = await client.submit({ agent: "one-in-all", input: { k: "b" } }).catch(() => undefined);
    return next ? await client.waitForJob(next.job.id) : undefined;
  }, "a job of key b to be admitted");
});

test("a job that holds its agent's place but lost its marker for the pool's (its dispatcher died between) is marked again by the sweep and runs", async () => {
  await using s = await system();
  const { nats, client } = s;
  const { names } = nats.topology;
  await client.setPolicy({ pools: { default: { concurrency: 1 } } });
  await client.applyAgent({ name: "slow", command: "sleep 1.5", trusted: true, runtime: { sandbox: "host" } });
  await client.applyAgent({ name: "limited", command: "true", trusted: true, runtime: { sandbox: "host" }, concurrency: { limit: 5 } });
  const first = (await client.submit({ agent: "slow" })).job;
  const second = (await client.submit({ agent: "limited" })).job;
  expect(second.concurrency).toMatchObject({ place: "=pool.default", places: ["limited.all", "=pool.default"], waiting: true });
  // As if its dispatcher died before storing its marker: none, and its place held since long ago.
  const marker = await nats.topology.jsm.streams.getMessage(names.streams.work, {
    last_by_subj: names.subjects.heldWork("=pool.default", second.id),
  });
  expect(marker).toBeTruthy();
  await nats.topology.jsm.streams.deleteMessage(names.streams.work, marker?.seq as number);
  const limits = await nats.topology.limits();
  await limits.put("=places.limited.all", JSON.stringify({ holding: { [second.id]: Date.now() - 120_000 }, cursor: 0, tail: 0 }));
  expect(await client.waitForJob(first.id)).toMatchObject({ state: "succeeded" });
  expect(await client.waitForJob(second.id)).toMatchObject({ state: "succeeded", concurrency: { place: "=pool.default" } });
});

test("a total without a key, and a pool limit that is no count, are refused naming the field", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await expect(client.applyAgent({ name: "bad", command: "true", concurrency: { limit: 1, total: 4 } })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "definition.concurrency.total" })],
  });
  await expect(client.setPolicy({ pools: { gpu: { concurrency: 0 } } })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "policy.pools.gpu.concurrency" })],
  });
});

test("a key given to an agent whose jobs wait under its limit for all: they still run one at a time, under the limit they waited for", async () => {
  await using s = await system();
  const { nats, client } = s;
  const agent = { name: "one", command: "sleep 0.5", trusted: true, runtime: { sandbox: "host" as const } };
  await client.applyAgent({ ...agent, concurrency: { limit: 1 } });
  const seen = runningSet(nats.nc, nats.topology.names.prefix, () => ["one"]);
  try {
    const jobs: JobRecord[] = [];
    for (let i = 0; i < 4; i++) jobs.push((await client.submit({ agent: "one" })).job);
    expect(jobs.filter((j) => j.concurrency?.waiting).length).toBe(3);
    await client.applyAgent({ ...agent, concurrency: { limit: 1, key: "input.k", total: 5 } });
    const done = await Promise.all(jobs.map((j) => client.waitForJob(j.id)));
    expect(done.map((j) => j.state)).toEqual(["succeeded", "succeeded", "succeeded", "succeeded"]);
    expect(seen.most.get("one")).toBe(1);
  } finally {
    seen.stop();
  }
}, 60_000);

test("a delayed job's places, taken at its time, are not freed by a sweep that reads its record before it names them", async () => {
  await using s = await system();
  const { nats, client } = s;
  // The release of a delayed job (its record naming its places) written a second late, as under
  // load, while the dispatchers sweep every half second.
  const store = nats.dispatcherRole.topology.jobStore;
  const change = store.change.bind(store);
  store.change = (async (found, edit) => {
    const record = typeof found === "string" ? undefined : found.record;
    if (record?.runAt !== undefined && record.state === "queued") await new Promise((r) => setTimeout(r, 1_000));
    return change(found, edit);
  }) as typeof store.change;
  await client.applyAgent({ name: "later", command: "sleep 2", trusted: true, runtime: { sandbox: "host" }, concurrency: { limit: 1 } });
  const seen = runningSet(nats.nc, nats.topology.names.prefix, () => ["later"]);
  try {
    const runAt = new Date(Date.now() + 1_500).toISOString();
    const jobs: JobRecord[] = [];
    for (let i = 0; i < 3; i++) jobs.push((await client.submit({ agent: "later", runAt })).job);
    const done = await Promise.all(jobs.map((j) => client.waitForJob(j.id)));
    expect(done.map((j) => j.state)).toEqual(["succeeded", "succeeded", "succeeded"]);
    expect(seen.most.get("later")).toBe(1);
  } finally {
    seen.stop();
  }
}, 60_000);

test("cancel-in-progress cancels under its agent's own limit only: a job given the strategy while it waits for the pool cancels nobody else's", async () => {
  await using s = await system();
  const { nats, client } = s;
  const { names } = nats.topology;
  await client.setPolicy({ pools: { default: { concurrency: 2 } } });
  // Running past the 5 s after which the admission sweeper stores a young job's lost work again.
  await client.applyAgent({ name: "other", command: "sleep 7", trusted: true, runtime: { sandbox: "host" } });
  const plain = { name: "newest", command: "true", trusted: true, runtime: { sandbox: "host" as const } };
  await client.applyAgent(plain);
  const others = [(await client.submit({ agent: "other" })).job, (await client.submit({ agent: "other" })).job];
  const waiting = (await client.submit({ agent: "newest" })).job;
  expect(waiting.concurrency).toMatchObject({ place: "=pool.default", waiting: true });
  await client.applyAgent({ ...plain, concurrency: { limit: 1, strategy: "cancel-in-progress" } });
  // Its marker lost: the admission sweeper stores it again (a duplicate to the stream, within its
  // window), under the pool's limit, not its agent's.
  const marker = await nats.topology.jsm.streams.getMessage(names.streams.work, {
    last_by_subj: names.subjects.heldWork("=pool.default", waiting.id),
  });
  await nats.topology.jsm.streams.deleteMessage(names.streams.work, marker?.seq as number);
  const done = await Promise.all(others.map((j) => client.waitForJob(j.id)));
  expect(done.map((j) => j.state)).toEqual(["succeeded", "succeeded"]);
  await client.cancelJob(waiting.id);
}, 60_000);

test("a job whose agent was removed while it waited between two limits with its marker lost ends unknown_agent and frees its place", async () => {
  await using s = await system();
  const { nats, client } = s;
  const { names } = nats.topology;
  await client.setPolicy({ pools: { default: { concurrency: 1 } } });
  await client.applyAgent({ name: "slow", command: "sleep 1", trusted: true, runtime: { sandbox: "host" } });
  await client.applyAgent({ name: "gone", command: "true", trusted: true, runtime: { sandbox: "host" }, concurrency: { limit: 5 } });
  const first = (await client.submit({ agent: "slow" })).job;
  const second = (await client.submit({ agent: "gone" })).job;
  const marker = await nats.topology.jsm.streams.getMessage(names.streams.work, {
    last_by_subj: names.subjects.heldWork("=pool.default", second.id),
  });
  await nats.topology.jsm.streams.deleteMessage(names.streams.work, marker?.seq as number);
  const limits = await nats.topology.limits();
  await limits.put("=places.gone.all", JSON.stringify({ holding: { [second.id]: Date.now() - 120_000 }, cursor: 0, tail: 0 }));
  await client.removeAgent("gone");
  expect(await client.waitForJob(first.id)).toMatchObject({ state: "succeeded" });
  expect(await client.waitForJob(second.id)).toMatchObject({ state: "failed", error: { code: ErrorCode.unknownAgent } });
  await eventually(async () => {
    const held = JSON.parse((await limits.get("=places.gone.all"))?.string() ?? "{}").holding ?? {};
    return Object.keys(held).length === 0 ? true : undefined;
  }, "its place to be freed");
}, 60_000);
