/**
 * `boxcar jobs --state failed --limit 20` with many jobs stored: `pnpm bench:list`.
 * One nats-server; BENCH_N job records (default 100 000, 1% failed, the rest succeeded, spread
 * over 10 agents) are written straight into the jobs bucket, then a dispatcher starts (in this
 * process) and replays them. Timed, BENCH_ROUNDS times each (default 50): `jobs.list` through the
 * SDK with a state filter, with an agent filter and with none, at a few page sizes, two filters no
 * job matches (one the index's counts answer, one whose walk passes every job) and a page from
 * the middle; and the `boxcar jobs`
 * command as a user runs it (a new process each time, so its start is counted; BENCH_CLI=0 leaves
 * it out). Also the dispatcher's start (until it counts every job: its replay is over), the
 * heap and resident memory it keeps per job once it has replayed them (run with --expose-gc,
 * as the script does), how fast new jobs are submitted beside them (BENCH_SUBMITS, default
 * 2 000, 64 at once; purged after), and what removing one record from so big a bucket costs,
 * by a purge filtered on its key and by its sequence.
 *
 * BENCH_STORE: the server's store folder, kept after the run; when its jobs bucket already holds
 * BENCH_N records they are not written again, so one store of a million jobs serves several runs
 * (and builds: an A/B against an older commit runs its own copy of this file on the same store).
 */
import { execFile } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { createClient } from "@boxcar/client";
import type { Logger } from "@boxcar/common";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, startNatsServer, type Topology } from "@boxcar/fabric";
import { type JobRecord, PROTOCOL_VERSION } from "@boxcar/protocol";
import { connect } from "@nats-io/transport-node";
import { envInt, ms, summarize, table } from "./stats.js";

const run = promisify(execFile);
const BOXCAR_BIN = fileURLToPath(new URL("../../packages/cli/dist/bundle/boxcar.js", import.meta.url));

async function main(): Promise<void> {
  const n = envInt("BENCH_N", 100_000);
  const rounds = envInt("BENCH_ROUNDS", 50);
  const storeDir = process.env.BENCH_STORE;
  const server = await startNatsServer(storeDir ? { storeDir } : {});
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  const topology = await openTopology(nc, { prefix: "bench" });
  try {
    const start = Date.now() - n * 10;
    const record = (i: number): JobRecord => {
      const at = new Date(start + i * 10).toISOString();
      const id = `${(start + i * 10).toString(36).padStart(9, "0")}${i.toString(36).padStart(10, "0")}`;
      const failed = i % 100 === 0;
      return {
        v: PROTOCOL_VERSION,
        id,
        agent: `agent${i % 10}`,
        pool: "default",
        owner: "local",
        state: failed ? "failed" : "succeeded",
        spec: { v: PROTOCOL_VERSION, agent: `agent${i % 10}`, input: { i }, files: [], labels: {} },
        attempt: 1,
        createdAt: at,
        finishedAt: at,
        artifacts: [],
        history: [],
        ...(failed ? { error: { code: "agent_failed", message: "exit 1" } } : {}),
      } as JobRecord;
    };
    const stored = (await topology.jsm.streams.info(`KV_${topology.names.buckets.jobs}`)).state.messages;
    const writeStart = performance.now();
    if (stored !== n) {
      if (stored !== 0) throw new Error(`the store holds ${stored} job records, not ${n}: give BENCH_STORE a new folder`);
      for (let i = 0; i < n; i += 256) {
        await Promise.all(Array.from({ length: Math.min(256, n - i) }, (_, k) => topology.jobStore.create({ record: record(i + k) })));
      }
    }
    const written = stored === n ? "already stored" : `written in ${((performance.now() - writeStart) / 1000).toFixed(1)} s`;

    // No snapshot of the job index from an earlier run: this start reads every record.
    const snapshotStream = `OBJ_${topology.names.buckets.jobIndex}`;
    await topology.jsm.streams.delete(snapshotStream).catch(() => {});
    const heapBefore = settledHeap();
    const rssBefore = process.memoryUsage().rss;
    const started = performance.now();
    const dispatcher = await startDispatcher({ topology });
    const startedMs = performance.now() - started;
    const client = createClient(topology);
    // Caught up is when the dispatcher counts every job (a list waits at most 5 s for the
    // replay, and while it replays the dispatcher may not answer in the client's 10 s).
    while ((await client.countJobs().catch(() => ({ total: 0 }))).total < n) await sleep(50);
    const caughtUpMs = performance.now() - started;
    // The first list sorts the ids the replay brought in store order.
    const firstStart = performance.now();
    const first = await client.listJobs({ state: "failed", limit: 20 });
    const firstMs = performance.now() - firstStart;
    if (first.jobs.length !== 20 || first.jobs.some((j) => j.state !== "failed")) throw new Error("the first page is not 20 failed jobs");
    await sleep(2_000); // the replay's garbage collected, what stays is what the dispatcher keeps
    const heapPerJob = (settledHeap() - heapBefore) / n;
    const rssPerJob = (process.memoryUsage().rss - rssBefore) / n;

    const time = async (request: Parameters<typeof client.listJobs>[0], expected: number) => {
      const samples: number[] = [];
      for (let r = 0; r < rounds; r++) {
        const t = performance.now();
        const page = await client.listJobs(request);
        samples.push(performance.now() - t);
        if (page.jobs.length !== expected) throw new Error(`a page of ${page.jobs.length}, not ${expected}`);
      }
      return summarize(samples);
    };
    // A cursor in the middle of the jobs: the id of job n/2.
    const middle = record(Math.floor(n / 2)).id;
    const rows = [["request", "p50", "p99", "max"]];
    for (const [name, request, expected] of [
      ["jobs.list state=failed limit=20", { state: "failed", limit: 20 }, 20],
      ["jobs.list state=failed limit=100", { state: "failed", limit: 100 }, 100],
      ["jobs.list agent=agent3 limit=20", { agent: "agent3", limit: 20 }, 20],
      ["jobs.list limit=20", { limit: 20 }, 20],
      ["jobs.list limit=100", { limit: 100 }, 100],
      ["jobs.list limit=1000", { limit: 1000 }, 1000],
      ["jobs.list state=failed limit=20, after the middle job", { state: "failed", limit: 20, after: middle }, 20],
      // No job matches: the first by the counts, the second (a pool: not counted) by a walk past every job.
      ["jobs.list state=running limit=20 (none)", { state: "running", limit: 20 }, 0],
      [
        "jobs.list state=failed agent=agent3 pool=default (none; walks all)",
        { state: "failed", agent: "agent3", pool: "default", limit: 20 },
        0,
      ],
    ] as const) {
      const s = await time(request, expected).catch((err: unknown) => {
        throw new Error(`${name}: ${(err as Error).message}`);
      });
      rows.push([name, ms(s.p50), ms(s.p99), ms(s.max)]);
    }
    // Removing one record from the bucket, as retention does: a purge filtered on its key's
    // subject, or a delete by its sequence (a key of the bench's own, written each round).
    const bucket = topology.names.buckets.jobs;
    for (const [name, remove] of [
      [
        "a record removed by a purge filtered on its key",
        (_seq: number) => topology.jsm.streams.purge(`KV_${bucket}`, { filter: `$KV.${bucket}.bench-removal` }),
      ],
      ["a record removed by its sequence", (seq: number) => topology.jsm.streams.deleteMessage(`KV_${bucket}`, seq, false)],
    ] as const) {
      const samples: number[] = [];
      for (let r = 0; r < rounds; r++) {
        const seq = await topology.jobs.put("bench-removal", "{}");
        const t = performance.now();
        await remove(seq);
        samples.push(performance.now() - t);
      }
      const s = summarize(samples);
      rows.push([name, ms(s.p50), ms(s.p99), ms(s.max)]);
    }
    const cli: number[] = [];
    for (let r = 0; r < (process.env.BENCH_CLI === "0" ? 0 : Math.min(rounds, 10)); r++) {
      const t = performance.now();
      // Not execFileSync: the dispatcher answering it runs in this process.
      await run(process.execPath, [BOXCAR_BIN, "jobs", "--state", "failed", "--limit", "20", "--prefix", "bench"], {
        env: { ...process.env, BOXCAR_NATS_URL: server.url },
      });
      cli.push(performance.now() - t);
    }
    const c = summarize(cli);
    if (cli.length > 0) rows.push(["boxcar jobs --state failed --limit 20 (a new process)", ms(c.p50), ms(c.p99), ms(c.max)]);
    const bare: number[] = [];
    for (let r = 0; r < cli.length; r++) {
      const t = performance.now();
      await run(process.execPath, [BOXCAR_BIN, "--help"]);
      bare.push(performance.now() - t);
    }
    const version = summarize(bare);
    if (bare.length > 0) rows.push(["boxcar --help (the process start alone)", ms(version.p50), ms(version.p99), ms(version.max)]);
    // New jobs while the index holds them all: their ids come in the order their submits end,
    // not the order they were made, as a busy dispatcher's do. Taken back after (purged), so
    // the store holds its n records for the next run.
    const submits = envInt("BENCH_SUBMITS", 2_000);
    await client.applyAgent({ name: "bench-new", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    const made: string[] = [];
    const failures = new Map<string, number>();
    let asked = 0;
    const submitStart = performance.now();
    await Promise.all(
      Array.from({ length: 64 }, async () => {
        while (asked < submits) {
          asked += 1;
          await client.submit({ agent: "bench-new", input: { asked } }).then(
            ({ job }) => made.push(job.id),
            (err: Error) => failures.set(err.message, (failures.get(err.message) ?? 0) + 1),
          );
        }
      }),
    );
    const submitSeconds = (performance.now() - submitStart) / 1000;
    // Every bench-new record goes, those of a submit that timed out too (once the dispatcher has them).
    const gone = new Set<string>();
    for (let round = 0; round < 30; round++) {
      for (const id of made) {
        // By sequence: a purge filtered on the key takes the server 0.2 s in a bucket this big.
        const entry = gone.has(id) ? null : await topology.jobs.get(id);
        if (entry) await topology.jsm.streams.deleteMessage(`KV_${bucket}`, entry.revision, false);
      }
      for (const id of made) gone.add(id);
      if ((await topology.jsm.streams.info(`KV_${bucket}`)).state.messages <= n) break;
      await sleep(1_000);
      const left = await client.listJobs({ agent: "bench-new", limit: 1_000 }).catch(() => ({ jobs: [] }));
      made.push(...left.jobs.map((j) => j.id));
    }
    const failed = [...failures].map(([message, times]) => `${times} x ${message}`).join("; ");
    const accepted = submits - [...failures.values()].reduce((a, b) => a + b, 0);
    const submitted = `${accepted} of ${submits} new jobs submitted 64 at once beside them in ${submitSeconds.toFixed(1)} s (${(accepted / submitSeconds).toFixed(0)} jobs/s)${failed ? `; failed: ${failed}` : ""}`;
    await dispatcher.close();
    const snapshot = await startFromSnapshot(topology, n);
    const mib = (bytes: number) => `${(bytes / 1024 ** 2).toFixed(0)} MiB`;
    process.stdout.write(
      `${n} jobs ${written}; a dispatcher started in ${startedMs.toFixed(0)} ms and counted every job (its replay over) in ${caughtUpMs.toFixed(0)} ms, ` +
        `keeping ${heapPerJob.toFixed(0)} bytes of heap and ${rssPerJob.toFixed(0)} of RSS a job; ` +
        `RSS ${mib(rssBefore)} before it started, ${mib(process.memoryUsage().rss)} after (this process: a client, the dispatcher); ` +
        `the first list took ${firstMs.toFixed(0)} ms; ` +
        `${submitted}\n${snapshot}\n${table(rows)}\n`,
    );
  } finally {
    await nc.close();
    await server.stop();
  }
}

/**
 * A dispatcher that writes the job index's snapshot once it has read every record, then one that
 * starts from it: what each took, as they log it, and the second's start until it counts every job.
 */
async function startFromSnapshot(topology: Topology, n: number): Promise<string> {
  const lines: { msg: string; fields: Record<string, unknown> }[] = [];
  const keep = (_level: string) => (fields: object, msg?: string) => void lines.push({ msg: msg ?? "", fields: { ...fields } });
  const logger: Logger = { debug: keep("debug"), info: keep("info"), warn: keep("warn"), error: keep("error"), child: () => logger };
  const logged = (msg: string) => lines.find((l) => l.msg === msg)?.fields ?? {};
  const client = createClient(topology);
  const counted = async () => {
    while ((await client.countJobs().catch(() => ({ total: 0 }))).total < n) await sleep(50);
  };
  const writer = await startDispatcher({ topology, logger, indexSnapshotIntervalMs: 1_000 });
  await counted();
  while (!logged("wrote a snapshot of the job index").writeMs) await sleep(100);
  await writer.close();
  const rssBefore = process.memoryUsage().rss;
  const started = performance.now();
  const dispatcher = await startDispatcher({ topology, logger });
  await counted();
  const startMs = performance.now() - started;
  const rssAfter = process.memoryUsage().rss;
  await dispatcher.close();
  const wrote = logged("wrote a snapshot of the job index");
  const read = logged("the job index starts from a snapshot");
  if (read.settled !== n) throw new Error(`the start from the snapshot gave the index ${read.settled} jobs, not ${n}`);
  const mb = (bytes: unknown) => `${((bytes as number) / 1e6).toFixed(1)} MB`;
  return (
    `the job index's snapshot (${mb(wrote.bytes)}) was cut in ${wrote.cutMs} ms (the dispatcher busy) and written in ${wrote.writeMs} ms; ` +
    `a dispatcher started from it counted every job in ${startMs.toFixed(0)} ms (read in ${read.readMs} ms, the index given its jobs in ${read.restoreMs} ms), ` +
    `RSS ${((rssAfter - rssBefore) / 1024 ** 2).toFixed(0)} MiB more after`
  );
}

/** The heap in use after two full collections (0 without --expose-gc). */
function settledHeap(): number {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) return 0;
  gc();
  gc();
  return process.memoryUsage().heapUsed;
}

await main();
