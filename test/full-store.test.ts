import { setTimeout as sleep } from "node:timers/promises";
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { type BoxcarError, names } from "@boxcar/protocol";
import { eventually, natsFixture, uniquePrefix } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { DiscardPolicy, type JetStreamManager, jetstreamManager, RetentionPolicy } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";

const MiB = 1024 ** 2;

/** The streams of a system, by name, with what each reserves. */
async function streamsOf(jsm: JetStreamManager, prefix: string): Promise<Record<string, number>> {
  const found: Record<string, number> = {};
  for await (const s of jsm.streams.list()) {
    if (s.config.name.startsWith(`${prefix.toUpperCase()}_`) || s.config.name.includes(`_${prefix}_`)) {
      found[s.config.name] = s.config.max_bytes;
    }
  }
  return found;
}

/** Starts `boxcar dispatcher ARGS` and resolves once it has started; it is stopped by the caller. */
async function startedDispatcher(url: string, prefix: string, args: string[]) {
  const dispatcher = spawnBoxcar(url, prefix, ["dispatcher", ...args]);
  await eventually(async () => {
    if (dispatcher.exitCode !== null) throw new Error(`the dispatcher exited: ${dispatcher.output()}`);
    return dispatcher.output().includes("dispatcher started") ? true : undefined;
  }, "the dispatcher to start");
  return dispatcher;
}

/** The `e.g. events=..,logs=..` a refusal advises, as the flag's value. */
const adviceOf = (stderr: string): string | undefined => /e\.g\. (events=\S+,logs=\S+,dead=\S+,submit=\S+?)[ ,;]/.exec(stderr)?.[1];

test("a start refused on a small server leaves no stream behind, and the sizes it advises are accepted", async () => {
  await using server = await startNatsServer({ maxFileStore: 64 * MiB });
  const nc = await connect({ servers: server.url });
  try {
    const jsm = await jetstreamManager(nc);
    const prefix = uniquePrefix();

    // The default sizes (1.8 GiB in all) on a 64 MiB store: refused in one line, with sizes that fit.
    const refused = await boxcar(server.url, prefix, ["dispatcher"]);
    expect(refused.code).toBe(3);
    expect(refused.stderr.trim().split("\n")).toHaveLength(1);
    expect(refused.stderr).toContain("storage_full: JetStream has less file storage free than Boxcar's streams reserve");
    expect(refused.stderr).toContain("64Mi is free");
    expect(await streamsOf(jsm, prefix)).toEqual({}); // not even the work stream it made first

    const advice = adviceOf(refused.stderr);
    expect(advice).toBe("events=17Mi,logs=8Mi,dead=4Mi,submit=1Mi");
    const dispatcher = await startedDispatcher(server.url, prefix, ["--stream-limits", advice as string]);
    dispatcher.kill("SIGTERM");
    await exited(dispatcher);
    const { streams } = names(prefix);
    expect(await streamsOf(jsm, prefix)).toMatchObject({
      [streams.events]: 17 * MiB,
      [streams.logs]: 8 * MiB,
      [streams.dead]: 4 * MiB,
      [streams.submit]: MiB,
      [streams.work]: -1,
    });
  } finally {
    await nc.close();
  }
}, 60_000);

test("a stream left by an earlier start is shrunk to the size a later one is given", async () => {
  await using server = await startNatsServer({ maxFileStore: 64 * MiB });
  const nc = await connect({ servers: server.url });
  try {
    const jsm = await jetstreamManager(nc);
    const prefix = uniquePrefix();
    const { streams, subjects } = names(prefix);
    // What a refused start of the release before left: the work stream, and an intake reserving the whole store.
    await jsm.streams.add({ name: streams.work, subjects: [subjects.workAll], retention: RetentionPolicy.Workqueue });
    await jsm.streams.add({
      name: streams.submit,
      subjects: [subjects.submitAll],
      retention: RetentionPolicy.Workqueue,
      max_bytes: 64 * MiB,
      discard: DiscardPolicy.New,
    });

    // With the default sizes: refused, and nothing more is made; the advice shrinks the intake.
    const refused = await boxcar(server.url, prefix, ["dispatcher"]);
    expect(refused.code).toBe(3);
    expect(refused.stderr).toContain(`0Mi is free (${streams.submit} reserves 64Mi)`);
    expect(adviceOf(refused.stderr)).toBe("events=17Mi,logs=8Mi,dead=4Mi,submit=1Mi");
    expect(Object.keys(await streamsOf(jsm, prefix)).sort()).toEqual([streams.submit, streams.work].sort());

    // What the operator tried next, refused before: the intake is shrunk to the 4 MiB given.
    const dispatcher = await startedDispatcher(server.url, prefix, ["--stream-limits", "events=16Mi,logs=8Mi,dead=4Mi,submit=4Mi"]);
    dispatcher.kill("SIGTERM");
    await exited(dispatcher);
    expect(await streamsOf(jsm, prefix)).toMatchObject({ [streams.submit]: 4 * MiB, [streams.events]: 16 * MiB });

    // Never below what it holds: waiting submissions are not dropped by a shrink.
    await jsm.jetstream().publish(`${prefix}.submit.local.noop`, new Uint8Array(600_000));
    await jsm.jetstream().publish(`${prefix}.submit.local.noop`, new Uint8Array(600_000));
    const topology = await openTopology(nc, { prefix, streamLimits: { submit: MiB } });
    const intake = await topology.jsm.streams.info(streams.submit);
    expect([intake.config.max_bytes, intake.state.messages]).toEqual([2 * MiB, 2]);
  } finally {
    await nc.close();
  }
}, 60_000);

test("buckets made on first use fit a small server; with role credentials, a refused start leaves at most an empty work stream", async () => {
  // The system fits (20 MiB of 48); the limits, schedules and usage buckets ask 256 MiB each by default.
  await using nats = await natsFixture(
    { streamLimits: { events: 8 * MiB, logs: 6 * MiB, dead: 4 * MiB, submit: 2 * MiB } },
    { maxFileStore: 48 * MiB },
  );
  const { topology } = nats.dispatcherRole;
  const { buckets } = topology.names;
  await topology.limits();
  await topology.schedules();
  await topology.usage();
  const maxBytes = async (bucket: string) => (await nats.topology.jsm.streams.info(`KV_${bucket}`)).config.max_bytes;
  // A quarter of what is free, each: 28 MiB, then 21, then 16.
  expect([await maxBytes(buckets.limits), await maxBytes(buckets.schedules), await maxBytes(buckets.usage)]).toEqual([
    7 * MiB,
    5 * MiB,
    4 * MiB,
  ]);

  // A role's credentials may create the system's streams but not delete them. A refused start
  // makes none of the streams that reserve storage, so it leaves nothing where the system exists...
  const before = await streamsOf(nats.topology.jsm, topology.names.prefix);
  await nats.topology.jsm.streams.delete(topology.names.streams.events);
  const refusal = await openTopology(topology.nc, { prefix: topology.names.prefix, streamLimits: { events: 64 * MiB } }).then(
    () => undefined,
    (err: BoxcarError) => err,
  );
  expect(refusal?.code).toBe("storage_full");
  expect(refusal?.message).toContain("e.g. events=");
  const { [topology.names.streams.events]: _gone, ...rest } = before;
  expect(await streamsOf(nats.topology.jsm, topology.names.prefix)).toEqual(rest);

  // ...and only the empty work stream (it reserves nothing; the next start uses it) where it does not.
  for (const name of Object.keys(rest)) await nats.topology.jsm.streams.delete(name);
  const fresh = await openTopology(topology.nc, { prefix: topology.names.prefix }).then(
    () => undefined,
    (err: BoxcarError) => err,
  );
  expect(fresh?.message).toContain(`${topology.names.streams.work}, made by this start, could not be removed`);
  expect(await streamsOf(nats.topology.jsm, topology.names.prefix)).toEqual({ [topology.names.streams.work]: -1 });
}, 60_000);

test("eight submitters fill a small store to its last byte: every refused job is absent, or kept and reported accepted_pending", async () => {
  // Without credentials, as written when a dispatcher's could not answer a KV watch's flow control
  // ($JS.FC, allowed since in access.ts). A dispatcher on its own credential on a full store is in
  // test/full-store-recovery.test.ts.
  await using server = await startNatsServer({ maxFileStore: 32 * MiB });
  const streamLimits = { events: MiB, logs: MiB, dead: MiB, submit: MiB };
  const prefix = uniquePrefix();
  const nc = await connect({ servers: server.url });
  const workerNc = await connect({ servers: server.url });
  const topology = await openTopology(nc, { prefix, streamLimits });
  const dispatcher = await startDispatcher({ topology });
  const client = createClient(topology);
  const js = topology.js;
  try {
    await client.applyAgent({ name: "noop", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    // No headroom: once the store has been full, the dispatcher would refuse new work before
    // JetStream does, and this test is of JetStream's refusals at the last byte.
    await client.setPolicy({ queue: { headroom: 0 } });
    // Room set aside: `ROOM` is freed at the end for the jobs to run; `EDGE` a message at a time
    // while the submitters run, so that the store fills again and again under them.
    for (const [name, messages] of [
      ["ROOM", 16],
      ["EDGE", 24],
    ] as const) {
      await topology.jsm.streams.add({ name: `${topology.names.prefix}_${name}`, subjects: [`${topology.names.prefix}-${name}`] });
      for (let i = 0; i < messages; i++) await js.publish(`${topology.names.prefix}-${name}`, new Uint8Array(256 * 1024));
    }

    const pad = "x".repeat(200_000);
    const accepted: string[] = [];
    const refused: string[] = [];
    const pending: string[] = [];
    const other: string[] = [];
    let stop = false;
    const submitters = Array.from({ length: 8 }, async (_, s) => {
      for (let i = 0; !stop; i++) {
        try {
          accepted.push((await client.submit({ agent: "noop", input: { s, i, pad } })).job.id);
        } catch (err) {
          const { code, message } = err as BoxcarError;
          const id = /job ([0-9a-z]+)/.exec(message)?.[1] ?? "";
          if (code === "storage_full") refused.push(id);
          else if (code === "accepted_pending") pending.push(id);
          else other.push(`${code}: ${message}`);
          await sleep(5);
        }
      }
    });
    // Each time the store is full (refusals come), a little room frees.
    const edge = `${topology.names.prefix}_EDGE`;
    for (let freed = 0; freed < 24; freed++) {
      const seen = refused.length + pending.length;
      await eventually(async () => (refused.length + pending.length > seen + 8 ? true : undefined), "the store to fill", 30_000);
      const first = (await topology.jsm.streams.info(edge)).state.first_seq;
      await topology.jsm.streams.deleteMessage(edge, first, false);
    }
    await eventually(async () => (refused.length + pending.length > 200 ? true : undefined), "the store to fill", 30_000);
    stop = true;
    await Promise.all(submitters);
    expect(other).toEqual([]);
    expect(accepted.length).toBeGreaterThan(100);

    // A clean refusal kept nothing; a pending one kept its record, queued.
    const record = async (id: string) => {
      const entry = await topology.jobs.get(id);
      return entry?.operation === "PUT" ? (JSON.parse(entry.string()) as { state: string }) : undefined;
    };
    for (const id of refused) expect(await record(id), `job ${id}, refused with storage_full`).toBeUndefined();
    for (const id of pending) expect((await record(id))?.state, `job ${id}, accepted_pending`).toBe("queued");
    let stored = 0;
    for await (const key of await topology.jobs.keys()) if (await record(key)) stored += 1;
    expect(stored).toBe(accepted.length + pending.length);

    // Room frees: the dispatcher's view agrees with the bucket (a refused job's delete marker,
    // put off while the store was full, reaches its watch); every job kept runs once, and no
    // refused one ever does.
    await topology.jsm.streams.delete(`${topology.names.prefix}_ROOM`);
    await eventually(async () => ((await client.countJobs()).total === stored ? true : undefined), "the count to match the bucket");
    const workerTopology = await openTopology(workerNc, { prefix, streamLimits });
    await using worker = createWorker({ topology: workerTopology, concurrency: 4, providers: [createHostSandboxProvider()] });
    void worker.run();
    await eventually(
      async () => ((await client.countJobs()).counts.succeeded === accepted.length ? true : undefined),
      "the accepted jobs to run",
      60_000,
    );
    for (const id of refused) expect(await record(id), `job ${id}, refused with storage_full`).toBeUndefined();
  } finally {
    await dispatcher.close();
    await workerNc.close();
    await nc.close();
  }
}, 150_000);

test("a list of big records reads only what its page can hold, at any limit", async () => {
  // Without credentials, as above: 120 MB of records would stop a dispatcher's watch under them.
  await using server = await startNatsServer();
  const nc = await connect({ servers: server.url });
  const topology = await openTopology(nc, { prefix: uniquePrefix() });
  await using _dispatcher = await startDispatcher({ topology });
  const client = createClient(topology);
  // 600 records of 200 KB written as admission would (no agent need run them), and 20 small ones of another agent.
  const pad = "x".repeat(200_000);
  const now = new Date().toISOString();
  const records = Array.from({ length: 620 }, (_, i) => {
    const id = `${Date.now().toString(36).padStart(9, "0")}${String(i).padStart(10, "0")}`;
    const big = i < 600;
    return {
      v: 1,
      id,
      agent: big ? "big" : "small",
      pool: "default",
      owner: "local",
      priority: "normal",
      state: "queued",
      spec: { agent: big ? "big" : "small", input: big ? { pad } : { i }, files: [] },
      attempt: 0,
      createdAt: now,
      queuedAt: now,
      artifacts: [],
      history: [],
      attemptsAllowed: 1,
    };
  });
  for (let i = 0; i < records.length; i += 20) {
    await Promise.all(records.slice(i, i + 20).map((r) => topology.jobs.create(r.id, JSON.stringify(r))));
  }
  await eventually(async () => ((await client.countJobs({ agent: "big" })).total === 600 ? true : undefined), "the index");

  const page = await client.listJobs({ agent: "big", limit: 1000 });
  expect(page.jobs).toHaveLength(3); // 768 KiB of 200 KB records
  expect(page.next).toBe(page.jobs[2]?.id);
  expect(page.jobs.map((j) => j.id)).toEqual(
    records
      .slice(597, 600)
      .map((r) => r.id)
      .reverse(),
  );

  // Every big record once, newest first, by the cursor; then the small ones fill a page of 1000.
  const seen = page.jobs.map((j) => j.id);
  for (let next = page.next; next; ) {
    const more = await client.listJobs({ agent: "big", limit: 1000, after: next });
    seen.push(...more.jobs.map((j) => j.id));
    next = more.next;
  }
  expect(seen).toEqual(
    records
      .slice(0, 600)
      .map((r) => r.id)
      .reverse(),
  );
  const small = await client.listJobs({ agent: "small", limit: 1000 });
  expect([small.jobs.length, small.next]).toEqual([20, undefined]);

  // As the operator asked it, through the CLI.
  const cli = await boxcar(server.url, topology.names.prefix, ["jobs", "--agent", "big", "--limit", "1000"]);
  expect(cli.code, cli.stderr).toBe(0);
  await nc.close();
}, 90_000);
