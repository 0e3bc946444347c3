/**
 * Concurrency limits (issue 21, part 1): an agent's `concurrency` lets at most `limit` of its
 * jobs (of each value of its key) hold a place at once, across every dispatcher and worker,
 * against a real nats-server. What runs at once is read from the jobs' own events, in the order they were decided.
 */

import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type BoxcarClient, createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode, isTerminal, type JobRecord } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { runningSet } from "./helpers/running-set.js";

/** A job's key, as the one group the running set keeps it in (none: a job of another test). */
const keysOf = (keyOfJob: Map<string, string>, id: string): string[] => {
  const key = keyOfJob.get(id);
  return key === undefined ? [] : [key];
};

/** A nats-server with a short lease (redelivery after a crash comes in 1.5 s), two dispatchers, and a client. */
async function twoDispatchers(): Promise<{ nats: NatsFixture; client: BoxcarClient } & AsyncDisposable> {
  const nats = await natsFixture({ ackWaitMs: 1_500 });
  await nats.topology.ensurePoolConsumer("default");
  const dispatchers = [await startDispatcher({ ...nats.dispatcherRole }), await startDispatcher({ ...nats.dispatcherRole })];
  return {
    nats,
    client: createClient(nats.topology),
    async [Symbol.asyncDispose]() {
      for (const d of dispatchers) await d.close();
      await nats[Symbol.asyncDispose]();
    },
  };
}

test("3 worker processes of 4 slots, 300 jobs over 10 keys limited to 2 at once per key: never a third for a key, through a SIGKILL; each key gets its share", async () => {
  await using system = await twoDispatchers();
  const { nats, client } = system;
  const prefix = nats.topology.names.prefix;
  await client.applyAgent({
    name: "per-key",
    command: "sleep 0.2",
    trusted: true,
    runtime: { sandbox: "host" },
    concurrency: { limit: 2, key: "input.customerId" },
  });
  const keyOfJob = new Map<string, string>();
  const seen = runningSet(nats.nc, prefix, (id) => keysOf(keyOfJob, id));
  const workers = [0, 1, 2].map(() => spawnBoxcar(nats.url, prefix, ["worker", "--concurrency", "4"]));
  try {
    await eventually(async () => ((await client.listWorkers()).length === 3 ? true : undefined), "three live workers");
    // Each key's jobs in a block, the first key's first: without the limit the first keys would fill every slot.
    const jobs: JobRecord[] = [];
    for (let key = 0; key < 10; key++) {
      const batch = await Promise.all(
        Array.from({ length: 30 }, () => client.submit({ agent: "per-key", input: { customerId: `c${key}` } })),
      );
      for (const { job } of batch) {
        keyOfJob.set(job.id, `c${key}`);
        jobs.push(job);
      }
    }
    // 20 places over 12 slots: two of each key take a place at once, the rest wait, visibly.
    const waiting = jobs.filter((j) => j.concurrency?.waiting);
    expect(waiting.length).toBeGreaterThanOrEqual(280);
    // The last to wait (the first may have been given a place by now).
    expect((await client.getJob(waiting.at(-1)?.id as string)).concurrency).toMatchObject({ waiting: true });

    await eventually(async () => (seen.ended.length >= 90 ? true : undefined), "90 jobs to end", 120_000);
    const beforeKill = seen.ended.slice(0, 90);
    const killed = workers[0];
    killed?.kill("SIGKILL");
    if (killed) await exited(killed);

    const done = await Promise.all(jobs.map((j) => client.waitForJob(j.id)));
    expect(done.filter((j) => j.state !== "succeeded").map((j) => [j.id, j.state, j.error?.code])).toEqual([]);
    // The killed worker's jobs ran again elsewhere, keeping their places meanwhile.
    expect(done.filter((j) => j.attempt > 1).length).toBeGreaterThan(0);
    expect([...seen.most.entries()].filter(([, most]) => most > 2)).toEqual([]);
    expect(Math.max(...seen.most.values())).toBe(2);
    // Fair shares: of the first 90 jobs to end (before the kill, whose jobs keep their places
    // until their lease lapses), every key had about its tenth, though the keys were submitted
    // one after another.
    const shares = Array.from({ length: 10 }, (_, key) => beforeKill.filter((k) => k === `c${key}`).length);
    expect(Math.min(...shares), `each key's jobs among the first 90 to end: ${shares.join(" ")}`).toBeGreaterThanOrEqual(5);
    expect(Math.max(...shares), `each key's jobs among the first 90 to end: ${shares.join(" ")}`).toBeLessThanOrEqual(13);
  } finally {
    seen.stop();
    for (const w of workers) w.kill("SIGTERM");
    for (const w of workers) await exited(w);
  }
}, 240_000);

test("one limit for all an agent's jobs: the waiting ones say so in status, jobs and their events, and run as places free", async () => {
  await using system = await twoDispatchers();
  const { nats, client } = system;
  await using worker = createWorker({ ...nats.workerRole, concurrency: 6, providers: [createHostSandboxProvider()] });
  void worker.run();
  const gate = join(await mkdtemp(join(tmpdir(), "boxcar-gate-")), "open");
  await client.applyAgent({
    name: "one-at-a-time",
    // Each waits for the gate the test opens once it has looked at the waiting jobs.
    command: 'until [ -e "$GATE" ]; do sleep 0.05; done; sleep 0.3',
    env: { GATE: gate },
    trusted: true,
    runtime: { sandbox: "host" },
    concurrency: { limit: 1 },
  });
  const keyOfJob = new Map<string, string>();
  const seen = runningSet(nats.nc, nats.topology.names.prefix, (id) => keysOf(keyOfJob, id));
  try {
    const jobs: JobRecord[] = [];
    for (let i = 0; i < 4; i++) {
      const { job } = await client.submit({ agent: "one-at-a-time" });
      keyOfJob.set(job.id, "all");
      jobs.push(job);
    }
    expect(jobs.map((j) => j.concurrency?.waiting ?? false)).toEqual([false, true, true, true]);
    const last = jobs[3] as JobRecord;
    const status = await boxcar(nats.url, nats.topology.names.prefix, ["status", last.id]);
    expect(status.stdout).toContain("waits     for a place under its agent's concurrency limit");
    const list = await boxcar(nats.url, nats.topology.names.prefix, ["jobs", "--agent", "one-at-a-time"]);
    expect(list.stdout).toContain("queued (limit)");
    await writeFile(gate, "");

    const done = await Promise.all(jobs.map((j) => client.waitForJob(j.id)));
    expect(done.map((j) => j.state)).toEqual(["succeeded", "succeeded", "succeeded", "succeeded"]);
    expect(done.every((j) => j.concurrency?.waiting === undefined)).toBe(true);
    // One after another, in the order they came.
    for (let i = 1; i < done.length; i++) {
      expect(Date.parse(done[i]?.startedAt as string)).toBeGreaterThanOrEqual(Date.parse(done[i - 1]?.finishedAt as string));
    }
    expect(seen.most.get("all")).toBe(1);
    const messages: string[] = [];
    for await (const e of client.events(last.id)) if (e.kind === "job" && e.message) messages.push(`${e.type}: ${e.message}`);
    expect(messages).toEqual([
      "queued: waits for a place under its agent's concurrency limit",
      "released: given a place under its agent's concurrency limit",
    ]);
  } finally {
    seen.stop();
  }
});

test("a waiting job cancelled or expired is passed over; a new limit applies to the jobs still waiting", async () => {
  await using system = await twoDispatchers();
  const { nats, client } = system;
  await using worker = createWorker({ ...nats.workerRole, concurrency: 6, providers: [createHostSandboxProvider()] });
  void worker.run();
  const agent = { name: "gate", command: "sleep 1", trusted: true, runtime: { sandbox: "host" as const } };
  await client.applyAgent({ ...agent, concurrency: { limit: 1 } });
  const first = (await client.submit({ agent: "gate" })).job;
  const cancelled = (await client.submit({ agent: "gate" })).job;
  const expired = (await client.submit({ agent: "gate", queueTimeout: "300ms" })).job;
  const rest = [(await client.submit({ agent: "gate" })).job, (await client.submit({ agent: "gate" })).job];
  await client.cancelJob(cancelled.id);
  expect(await client.waitForJob(expired.id)).toMatchObject({
    state: "expired",
    error: { message: expect.stringContaining("waited for a place") },
  });
  // Neither leaves its marker in the work stream, to count as work.
  const { jsm, names } = nats.topology;
  for (const id of [cancelled.id, expired.id]) {
    const marker = await jsm.streams
      .getMessage(names.streams.work, { last_by_subj: names.subjects.heldWork("gate.all", id) })
      .catch(() => null);
    expect(marker).toBeNull();
  }
  // Three at once from now on: both the rest run together once the first ends.
  await client.applyAgent({ ...agent, concurrency: { limit: 3 } });
  expect(await client.waitForJob(cancelled.id)).toMatchObject({ state: "cancelled" });
  const [a, b] = await Promise.all(rest.map((j) => client.waitForJob(j.id)));
  expect(await client.waitForJob(first.id)).toMatchObject({ state: "succeeded" });
  expect([a?.state, b?.state]).toEqual(["succeeded", "succeeded"]);
  // Run together: each started before the other ended.
  expect(Date.parse(a?.startedAt as string)).toBeLessThan(Date.parse(b?.finishedAt as string));
  expect(Date.parse(b?.startedAt as string)).toBeLessThan(Date.parse(a?.finishedAt as string));
});

test("drop-new refuses a job that finds no place (conflict), and cancel-in-progress cancels the oldest so the newest runs", async () => {
  await using system = await twoDispatchers();
  const { nats, client } = system;
  await using worker = createWorker({ ...nats.workerRole, concurrency: 4, providers: [createHostSandboxProvider()] });
  void worker.run();
  const base = { command: "sleep 30", trusted: true, runtime: { sandbox: "host" as const } };
  await client.applyAgent({ ...base, name: "dropper", concurrency: { limit: 1, strategy: "drop-new" } });
  const running = (await client.submit({ agent: "dropper" })).job;
  await expect(client.submit({ agent: "dropper" })).rejects.toMatchObject({
    code: ErrorCode.conflict,
    message: expect.stringContaining("drops new jobs"),
  });
  await client.cancelJob(running.id);
  await client.waitForJob(running.id);
  // Its place is back once it ended.
  const again = await eventually(() => client.submit({ agent: "dropper" }).catch(() => undefined), "a place for a new job");
  await client.cancelJob(again.job.id);

  await client.applyAgent({ ...base, name: "latest", concurrency: { limit: 1, key: "input.doc", strategy: "cancel-in-progress" } });
  const old = (await client.submit({ agent: "latest", input: { doc: "a" } })).job;
  const other = (await client.submit({ agent: "latest", input: { doc: "b" } })).job;
  await eventually(async () => ((await client.getJob(old.id)).state === "running" ? true : undefined), "the first job to run");
  const middle = (await client.submit({ agent: "latest", input: { doc: "a" } })).job;
  const newest = (await client.submit({ agent: "latest", input: { doc: "a" } })).job;
  expect(await client.waitForJob(old.id)).toMatchObject({ state: "cancelled" });
  expect(await client.waitForJob(middle.id)).toMatchObject({ state: "cancelled" });
  await eventually(async () => ((await client.getJob(newest.id)).state === "running" ? true : undefined), "the newest job to run");
  // Another key's job was no one's to cancel.
  expect((await client.getJob(other.id)).state).toBe("running");
  for (const id of [newest.id, other.id]) await client.cancelJob(id);
});

test("a bad concurrency limit is refused, naming the field", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  for (const [concurrency, path] of [
    [{ limit: 0 }, "definition.concurrency.limit"],
    [{ limit: 2, key: "input" }, "definition.concurrency.key"],
    [{ limit: 2, strategy: "newest" }, "definition.concurrency.strategy"],
  ] as const) {
    await expect(client.applyAgent({ name: "bad", command: "true", concurrency } as never)).rejects.toMatchObject({
      code: ErrorCode.invalid,
      issues: [expect.objectContaining({ path })],
    });
  }
});

test("the sweep frees a place whose job ended while no dispatcher ran, and one held for a job that never got a record", async () => {
  await using nats = await natsFixture();
  const client = createClient(nats.topology);
  const sweeping = { ...nats.dispatcherRole, givenUpIntervalMs: 500 };
  let dispatcher = await startDispatcher(sweeping);
  await using worker = createWorker({ ...nats.workerRole, concurrency: 4, providers: [createHostSandboxProvider()] });
  void worker.run();
  await client.applyAgent({ name: "gate", command: "sleep 1", trusted: true, runtime: { sandbox: "host" }, concurrency: { limit: 1 } });
  const first = (await client.submit({ agent: "gate" })).job;
  const second = (await client.submit({ agent: "gate" })).job;
  expect(second.concurrency).toMatchObject({ waiting: true });
  // No dispatcher sees the first job end.
  await dispatcher.close();
  await eventually(async () => {
    const found = await nats.topology.jobStore.read(first.id);
    return found && isTerminal(found.record.state) ? true : undefined;
  }, "the first job to end");
  dispatcher = await startDispatcher(sweeping);
  try {
    expect(await client.waitForJob(second.id)).toMatchObject({ state: "succeeded" });

    // A place taken for a job whose admission died before its record: freed a minute on.
    const limits = await nats.topology.limits();
    await limits.put("=places.gate.all", JSON.stringify({ holding: { ghost: Date.now() - 120_000 }, cursor: 0, tail: 0 }));
    const third = (await client.submit({ agent: "gate" })).job;
    expect(third.concurrency).toMatchObject({ waiting: true });
    expect(await client.waitForJob(third.id)).toMatchObject({ state: "succeeded" });
  } finally {
    await dispatcher.close();
  }
});

test("a delayed job takes its place at its time; `boxcar retry` of a dead job takes one again, and its end frees it", async () => {
  await using system = await twoDispatchers();
  const { nats, client } = system;
  await using worker = createWorker({ ...nats.workerRole, concurrency: 4, providers: [createHostSandboxProvider()] });
  void worker.run();
  const dir = await mkdtemp(join(tmpdir(), "boxcar-flag-"));
  const flag = join(dir, "ok");
  await client.applyAgent({
    name: "flaky",
    command: 'sleep 0.5; test -e "$FLAG"',
    env: { FLAG: flag },
    trusted: true,
    runtime: { sandbox: "host" },
    retry: { maxAttempts: 2, backoff: "fixed", delay: "10ms" },
    concurrency: { limit: 1 },
  });
  // The first fails twice and ends dead; the second waits for it, is given its place, and ends dead too.
  const first = (await client.submit({ agent: "flaky" })).job;
  const second = (await client.submit({ agent: "flaky" })).job;
  expect(second.concurrency).toMatchObject({ waiting: true });
  expect(await client.waitForJob(first.id)).toMatchObject({ state: "dead" });
  expect(await client.waitForJob(second.id)).toMatchObject({ state: "dead" });

  // Retried while a third holds the place, the second waits for it again, and runs.
  await writeFile(flag, "");
  await eventually(() => placesFree(nats), "the second job's place to be free", 5_000);
  const third = (await client.submit({ agent: "flaky" })).job;
  expect(third.concurrency?.waiting).toBeUndefined();
  expect((await client.retryJob(second.id)).concurrency).toMatchObject({ waiting: true });
  // A delayed job waits for its time, then for a place.
  const delayed = (await client.submit({ agent: "flaky", delay: "200ms" })).job;
  const [t, s, d] = await Promise.all([third, second, delayed].map((j) => client.waitForJob(j.id)));
  expect([t?.state, s?.state, d?.state]).toEqual(["succeeded", "succeeded", "succeeded"]);
  expect(Date.parse(s?.startedAt as string)).toBeGreaterThanOrEqual(Date.parse(t?.finishedAt as string));
  expect(Date.parse(d?.startedAt as string)).toBeGreaterThanOrEqual(Date.parse(s?.finishedAt as string));
  const released: string[] = [];
  for await (const e of client.events(delayed.id)) if (e.kind === "job" && e.type === "released") released.push(e.message ?? "");
  expect(released).toEqual(["given a place under its agent's concurrency limit"]);
  expect(d?.concurrency).toEqual({ place: "flaky.all" });
  // Every end freed its place, the retried job's second end too.
  await eventually(() => placesFree(nats), "every place to be free", 5_000);
});

/** True once no job holds a place under agent flaky's limit. */
async function placesFree(nats: NatsFixture): Promise<true | undefined> {
  const entry = await (await nats.topology.limits()).get("=places.flaky.all");
  return Object.keys(JSON.parse(entry?.string() ?? "{}").holding ?? {}).length === 0 ? true : undefined;
}
