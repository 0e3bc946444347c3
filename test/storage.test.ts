import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { type BoxcarError, names } from "@boxcar/protocol";
import { eventually, scratch, uniquePrefix } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";

const MiB = 1024 ** 2;

// A real nats-server whose JetStream may keep 48 MiB on disk: less than the 1.75 GiB Boxcar's
// history streams reserve by default.
test("on a server with too little JetStream storage, a role says so in one line; with smaller stream limits the system runs", async () => {
  await using server = await startNatsServer({ maxFileStore: 48 * 1024 ** 2 });
  const prefix = uniquePrefix();

  const refused = await boxcar(server.url, prefix, ["dispatcher"]);
  expect(refused.code).toBe(3);
  expect(refused.stderr).toContain("storage_full: JetStream has less file storage free than Boxcar's streams reserve");
  expect(refused.stderr).toContain("--stream-limits");
  expect(refused.stderr).not.toMatch(/^\s+at /m); // no stack trace
  expect(refused.stderr.trim().split("\n")).toHaveLength(1);

  const badFlag = await boxcar(server.url, prefix, ["dispatcher", "--stream-limits", "events=8Mi,log=8Mi"]);
  expect(badFlag.code).toBe(2);
  expect(badFlag.stderr).toContain('"log" is not a stream with a limit; use events, logs, dead, submit');

  // The first role makes the streams with the limits it is given (here from the environment);
  // later roles find them made.
  const dispatcher = spawnBoxcar(server.url, prefix, ["dispatcher"], { BOXCAR_STREAM_LIMITS: "events=8Mi,logs=8Mi,dead=4Mi,submit=2Mi" });
  await eventually(async () => (dispatcher.output().includes("dispatcher started") ? true : undefined), "the dispatcher");
  const worker = spawnBoxcar(server.url, prefix, ["worker"]);
  try {
    await eventually(
      async () => ((await boxcar(server.url, prefix, ["workers"])).stdout.includes("live") ? true : undefined),
      "the worker",
    );
    const applied = await boxcar(server.url, prefix, ["agent", "apply", "-f", "examples/agents/hello.yaml"]);
    expect(applied.code, applied.stderr).toBe(0);
    const run = await boxcar(server.url, prefix, ["submit", "hello", "--input", '{"name":"small"}', "--wait"]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain("succeeded");
  } finally {
    dispatcher.kill("SIGTERM");
    worker.kill("SIGTERM");
    await Promise.all([exited(dispatcher), exited(worker)]);
  }
}, 90_000);

test("a worker config file sets the stream limits of the system the worker creates; the flag overrides it", async () => {
  await using server = await startNatsServer({ maxFileStore: 48 * MiB });
  await using folder = await scratch("boxcar-limits-");
  const config = join(folder.path, "worker.yaml");
  await writeFile(config, "streamLimits:\n  events: 8Mi\n  logs: 6Mi\n  dead: 4Mi\n  submit: 2Mi\nsandbox:\n  allowed: [host]\n");
  const prefix = uniquePrefix();
  const worker = spawnBoxcar(server.url, prefix, ["worker", "--config", config]);
  try {
    await eventually(async () => (worker.output().includes("worker started") ? true : undefined), "the worker");
    const nc = await connect({ servers: server.url });
    try {
      const jsm = await jetstreamManager(nc);
      const maxBytes = async (stream: string) => (await jsm.streams.info(stream)).config.max_bytes;
      const { streams } = names(prefix);
      expect(await maxBytes(streams.events)).toBe(8 * MiB);
      expect(await maxBytes(streams.logs)).toBe(6 * MiB);
      expect(await maxBytes(streams.dead)).toBe(4 * MiB);
      expect(await maxBytes(streams.submit)).toBe(2 * MiB);
    } finally {
      await nc.close();
    }
  } finally {
    worker.kill("SIGTERM");
    await exited(worker);
  }
  // The flag replaces the file's limits: on another system, the default-sized events are refused.
  const refused = await boxcar(server.url, uniquePrefix(), ["worker", "--config", config, "--stream-limits", "events=1Gi"]);
  expect(refused.code).toBe(3);
  expect(refused.stderr).toContain("storage_full");
}, 90_000);

test("a submit on a full store is refused with storage_full, and no job is left half-admitted", async () => {
  await using server = await startNatsServer({ maxFileStore: 24 * 1024 ** 2 });
  const nc = await connect({ servers: server.url });
  const topology = await openTopology(nc, { prefix: uniquePrefix(), streamLimits: { events: MiB, logs: MiB, dead: MiB, submit: MiB } });
  const dispatcher = await startDispatcher({ topology });
  try {
    const client = createClient(topology);
    await client.applyAgent({ name: "noop", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    // Under the 128 KiB a command-line argument may hold, for the CLI's try below.
    const pad = "x".repeat(120_000);
    let accepted = 0;
    let refusal: BoxcarError | undefined;
    for (let i = 0; i < 500 && !refusal; i++) {
      try {
        await client.submit({ agent: "noop", input: { i, pad } });
        accepted += 1;
      } catch (err) {
        refusal = err as BoxcarError;
      }
    }
    expect(refusal?.code).toBe("storage_full");
    expect(refusal?.message).toContain("its store is full");
    expect(accepted).toBeGreaterThan(10);

    // As a user sees it: a refusal (exit 3) that names the cause.
    const cli = await boxcar(server.url, topology.names.prefix, ["submit", "noop", "--input", JSON.stringify({ i: -1, pad })]);
    expect(cli.code).toBe(3);
    expect(cli.stderr).toContain("storage_full");

    // Every accepted job has its record and its work item. A refused one is taken back, unless
    // the store was too full even for that: then, and only then, its refusal says it may still run.
    const records: string[] = [];
    for await (const key of await topology.jobs.keys()) {
      if ((await topology.jobs.get(key))?.operation === "PUT") records.push(key);
    }
    const work = await topology.jsm.streams.info(topology.names.streams.work);
    expect(work.state.messages).toBe(accepted);
    const leftBehind = [refusal?.message ?? "", cli.stderr].filter((m) => m.includes("may still run once space frees")).length;
    expect(records).toHaveLength(accepted + leftBehind);
  } finally {
    await dispatcher.close();
    await nc.close();
  }
}, 120_000);

test("a durable intake submission that meets a full store waits in its stream, and is admitted once space frees", async () => {
  await using server = await startNatsServer({ maxFileStore: 24 * 1024 ** 2 });
  const nc = await connect({ servers: server.url });
  const topology = await openTopology(nc, { prefix: uniquePrefix(), streamLimits: { events: MiB, logs: MiB, dead: MiB, submit: MiB } });
  const { names } = topology;
  const client = createClient(topology);
  let dispatcher = await startDispatcher({ topology });
  await client.applyAgent({ name: "noop", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
  await dispatcher.close();
  try {
    // Stored while no dispatcher runs; then something else takes the rest of the store.
    await topology.js.publish(`${names.prefix}.submit.local.noop`, JSON.stringify({ input: { pad: "x".repeat(100_000) } }));
    await topology.jsm.streams.add({ name: "FILLER", subjects: ["filler"] });
    // Filled to within 16 KiB: room for a small rejection record, none for the 100 KB job.
    for (const chunk of [512 * 1024, 64 * 1024, 16 * 1024]) {
      for (let stored = true; stored; ) {
        stored = await topology.js.publish("filler", new Uint8Array(chunk)).then(
          () => true,
          () => false,
        );
      }
    }
    dispatcher = await startDispatcher({ topology });
    await sleep(3_000);
    // Not admitted, and not recorded as rejected either: still waiting in the intake stream.
    const jobs: string[] = [];
    for await (const key of await topology.jobs.keys()) jobs.push(key);
    expect(jobs).toEqual([]);
    expect((await topology.jsm.streams.info(names.streams.submit)).state.messages).toBe(1);

    await topology.jsm.streams.delete("FILLER");
    const admitted = await eventually(async () => {
      const { jobs: listed } = await client.listJobs({ limit: 10 });
      return listed.length > 0 ? listed : undefined;
    }, "the intake submission to be admitted");
    expect(admitted).toHaveLength(1);
    expect(admitted[0]).toMatchObject({ agent: "noop", state: "queued" });
  } finally {
    await dispatcher.close();
    await nc.close();
  }
}, 120_000);

test("a worker started on a full store waits for room instead of exiting, then drains the queue", async () => {
  await using server = await startNatsServer({ maxFileStore: 24 * MiB });
  const nc = await connect({ servers: server.url });
  const prefix = uniquePrefix();
  const topology = await openTopology(nc, { prefix, streamLimits: { events: MiB, logs: MiB, dead: MiB, submit: MiB } });
  const client = createClient(topology);
  const dispatcher = await startDispatcher({ topology });
  let worker: ReturnType<typeof spawnBoxcar> | undefined;
  try {
    await client.applyAgent({ name: "noop", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    const { job } = await client.submit({ agent: "noop" });
    // Something else takes the rest of the store.
    await topology.jsm.streams.add({ name: "FILLER", subjects: ["filler"] });
    for (const chunk of [512 * 1024, 64 * 1024, 4 * 1024, 256]) {
      for (let stored = true; stored; ) {
        stored = await topology.js.publish("filler", new Uint8Array(chunk)).then(
          () => true,
          () => false,
        );
      }
    }
    worker = spawnBoxcar(server.url, prefix, ["worker"]);
    await eventually(
      async () => (worker?.output().includes("the presence entry: JetStream's store is full; waiting for room") ? true : undefined),
      "the worker to say it waits for room",
    );
    await sleep(2_000);
    expect(worker.exitCode).toBeNull();
    expect((await client.getJob(job.id)).state).toBe("queued");

    await topology.jsm.streams.delete("FILLER");
    expect((await client.waitForJob(job.id)).state).toBe("succeeded");
  } finally {
    worker?.kill("SIGTERM");
    if (worker) await exited(worker);
    await dispatcher.close();
    await nc.close();
  }
}, 90_000);

test("a flood of durable submissions is refused at the intake stream's limit; none stored is dropped, and all are admitted", async () => {
  await using server = await startNatsServer();
  const nc = await connect({ servers: server.url });
  const topology = await openTopology(nc, { prefix: uniquePrefix(), streamLimits: { submit: MiB } });
  const client = createClient(topology);
  let dispatcher = await startDispatcher({ topology });
  await client.applyAgent({ name: "noop", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
  await dispatcher.close();
  try {
    // No dispatcher admits them meanwhile: they pile up in the intake stream until its limit.
    const pad = "x".repeat(200_000);
    let stored = 0;
    let refusal = "";
    for (let i = 0; i < 20 && !refusal; i++) {
      await topology.js.publish(`${topology.names.prefix}.submit.local.noop`, JSON.stringify({ input: { i, pad } })).then(
        () => (stored += 1),
        (err: Error) => (refusal = err.message),
      );
    }
    expect(refusal).toContain("maximum bytes exceeded");
    expect(stored).toBe(5); // 5 × 200 KB fit in 1 MiB
    const info = await topology.jsm.streams.info(topology.names.streams.submit);
    expect([info.state.messages, info.config.discard]).toEqual([stored, "new"]);

    dispatcher = await startDispatcher({ topology });
    const counted = await eventually(async () => {
      const reply = await client.countJobs({ agent: "noop" });
      return reply.total === stored ? reply : undefined;
    }, "every stored submission to be admitted");
    expect(counted.counts.queued).toBe(stored);
    await eventually(
      async () => ((await topology.jsm.streams.info(topology.names.streams.submit)).state.messages === 0 ? true : undefined),
      "the intake stream to be empty",
    );
  } finally {
    await dispatcher.close();
    await nc.close();
  }
}, 60_000);

test("past the system's queue limit new work is refused with queue_full and nothing is kept; a worker drains the queue and submissions are admitted again", async () => {
  // A store with room to spare: the queue limit, not the store, is what refuses.
  await using server = await startNatsServer({ maxFileStore: 64 * MiB });
  const nc = await connect({ servers: server.url });
  const topology = await openTopology(nc, { prefix: uniquePrefix(), streamLimits: { events: MiB, logs: MiB, dead: MiB, submit: MiB } });
  const { names } = topology;
  const dispatcher = await startDispatcher({ topology });
  const client = createClient(topology);
  try {
    await client.applyAgent({ name: "noop", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    await client.setPolicy({ queue: { bytes: "2Mi" } });
    const pad = "x".repeat(100_000);
    const accepted: string[] = [];
    let refusal: BoxcarError | undefined;
    for (let i = 0; i < 100 && !refusal; i++) {
      try {
        accepted.push((await client.submit({ agent: "noop", input: { i, pad } })).job.id);
      } catch (err) {
        refusal = err as BoxcarError;
      }
    }
    expect(refusal?.code).toBe("queue_full");
    expect(refusal?.message).toMatch(
      /the queue is full: \d+ jobs \([\d.]+ [KM]iB\) wait to start, and the system policy allows 100000 jobs or 2 MiB/,
    );
    // 2 MiB of 100 KB records: about 20, whatever the watch's delay.
    expect(accepted.length).toBeGreaterThanOrEqual(19);
    expect(accepted.length).toBeLessThanOrEqual(22);

    // As a user sees it: a refusal (exit 3) that names the cause. Nothing was kept of any refusal.
    const cli = await boxcar(server.url, names.prefix, ["submit", "noop", "--input", '{"small":true}']);
    expect(cli.code).toBe(3);
    expect(cli.stderr).toContain("queue_full");
    const records: string[] = [];
    for await (const key of await topology.jobs.keys()) records.push(key);
    expect(records.sort()).toEqual([...accepted].sort());
    expect((await topology.jsm.streams.info(names.streams.work)).state.messages).toBe(accepted.length);
    // A workflow is new work too.
    const run = await client.startRun({ workflow: { name: "one", steps: [{ name: "a", agent: "noop" }] } }).catch((e: unknown) => e);
    expect(run).toMatchObject({ code: "queue_full" });

    // A durable intake submission waits in its stream for room, rather than being rejected.
    await topology.js.publish(`${names.prefix}.submit.local.noop`, JSON.stringify({ input: { from: "intake" } }));
    await sleep(1_500);
    expect((await topology.jsm.streams.info(names.streams.submit)).state.messages).toBe(1);

    // A worker started on the full queue drains it; the intake submission is admitted and runs.
    await using worker = createWorker({ topology, concurrency: 4, providers: [createHostSandboxProvider()] });
    void worker.run();
    for (const id of accepted) expect((await client.waitForJob(id)).state).toBe("succeeded");
    const fromIntake = await eventually(async () => {
      for await (const key of await topology.jobs.keys()) if (!accepted.includes(key)) return key;
      return undefined;
    }, "the intake submission to be admitted");
    expect((await client.waitForJob(fromIntake)).state).toBe("succeeded");
    // Listing these jobs pages by bytes: twenty records of 100 KB would not fit in one message.
    const listed: string[] = [];
    let pages = 0;
    for (let after: string | undefined, more = true; more; pages++) {
      const page = await client.listJobs({ limit: 100, ...(after ? { after } : {}) });
      listed.push(...page.jobs.map((j) => j.id));
      after = page.next;
      more = after !== undefined;
    }
    expect(listed.sort()).toEqual([...accepted, fromIntake].sort());
    expect(pages).toBeGreaterThan(1);
    const again = await client.submit({ agent: "noop", input: { pad } });
    expect((await client.waitForJob(again.job.id)).state).toBe("succeeded");
  } finally {
    await dispatcher.close();
    await nc.close();
  }
}, 120_000);
