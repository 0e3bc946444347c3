/**
 * Boxcar's round-trip benchmark: a no-op job end to end, beside the raw JetStream ceiling for
 * the same shape, all against one nats-server started here. Run it with `pnpm bench`; see
 * docs/benchmarks.md for what each figure means.
 *
 * Environment: BENCH_N (sequential jobs per path), BENCH_M (jobs per saturation run),
 * BENCH_IN_FLIGHT (default 64), BENCH_WARMUP (sequential warm-up jobs, then saturated batches of
 * twice as many until at least 3 s have passed), BENCH_PROFILE_N (jobs in the instrumented breakdown pass),
 * BENCH_WORK_ROOT (where host workspaces go; default the worker's: `/dev/shm` where it is a roomy
 * tmpfs, else the OS temporary folder; `BENCH_WORK_ROOT=/tmp` measures a disk here),
 * BENCH_ASYNC_TRACES=1 (connect with nats.js's async stack traces on; default off, as Boxcar's
 * roles and SDK connect, and for the raw JetStream path too), BENCH_METRICS=1 (the dispatcher
 * and worker keep Prometheus metrics, as with --metrics).
 */
import { execFileSync } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { cpus, totalmem } from "node:os";
import { join } from "node:path";
import { type NatsServer, startNatsServer } from "@boxcar/fabric";
import type { JobRecord } from "@boxcar/protocol";
import { createHostSandboxProvider, defaultWorkRoot, type SandboxProvider } from "@boxcar/worker";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { type BoxcarPath, openBoxcarPath } from "./boxcar-path.js";
import { findRedisServer, openBullmqPath, startRedisServer } from "./bullmq-path.js";
import { type CpuPerJob, cpuPerJob, cpuSnapshot } from "./cpu.js";
import { measureBareSpawn, measureHostSandbox } from "./host-spawn.js";
import { createInstantSandboxProvider } from "./instant-sandbox.js";
import { type RunJob, type Saturation, saturate, sequential } from "./load.js";
import { openRawPath } from "./raw-jetstream.js";
import { type MessageCounts, messageCounts, RoundTripLog, type RoundTripRow } from "./round-trips.js";
import { envInt, type LatencySummary, ms, summarize, table } from "./stats.js";

/** The commit measured, and whether the packages differ from it. */
function sourceVersion(): { commit: string; packagesModified: boolean } | null {
  try {
    const git = (...args: string[]) => execFileSync("git", args, { encoding: "utf8", cwd: new URL("..", import.meta.url).pathname }).trim();
    return { commit: git("rev-parse", "HEAD"), packagesModified: git("status", "--porcelain", "--", "../packages").length > 0 };
  } catch {
    return null;
  }
}

const settings = {
  sequentialJobs: envInt("BENCH_N", 1000),
  saturationJobs: envInt("BENCH_M", 5000),
  inFlight: envInt("BENCH_IN_FLIGHT", 64),
  warmupJobs: envInt("BENCH_WARMUP", 200),
  profileJobs: envInt("BENCH_PROFILE_N", 300),
  workerConcurrency: 64,
  workRoot: process.env.BENCH_WORK_ROOT || defaultWorkRoot(),
  asyncTraces: process.env.BENCH_ASYNC_TRACES === "1",
};
const connectOptions = { noAsyncTraces: !settings.asyncTraces };

interface PathResult {
  name: string;
  sequential: LatencySummary & { cpuPerJob: CpuPerJob };
  saturated: Saturation & { cpuPerJob: CpuPerJob };
}

/** The shortest warm-up of each path. */
const WARMUP_MS = 3_000;

const log = (line: string) => process.stderr.write(`${line}\n`);

/** Warm-up (sequential, then saturated), then the measured sequential and saturated runs. */
async function measurePath(name: string, run: RunJob, serverPid: number): Promise<PathResult> {
  let next = 0;
  const take = (n: number) => {
    const first = next;
    next += n;
    return first;
  };
  log(`${name}: warming up`);
  // At least WARMUP_MS of saturated work too, so a fast path is as warm (JIT, buffers) as a slow one.
  const warmStart = performance.now();
  await sequential(run, settings.warmupJobs, take(settings.warmupJobs));
  do await saturate(run, settings.warmupJobs * 2, settings.inFlight, take(settings.warmupJobs * 2));
  while (performance.now() - warmStart < WARMUP_MS);
  log(`${name}: ${settings.sequentialJobs} jobs one at a time`);
  const seqBefore = cpuSnapshot(serverPid);
  const seq = summarize(await sequential(run, settings.sequentialJobs, take(settings.sequentialJobs)));
  const seqCpu = cpuPerJob(seqBefore, cpuSnapshot(serverPid), settings.sequentialJobs);
  log(`${name}: ${settings.saturationJobs} jobs, ${settings.inFlight} in flight`);
  const before = cpuSnapshot(serverPid);
  const saturated = await saturate(run, settings.saturationJobs, settings.inFlight, take(settings.saturationJobs));
  const cpu = cpuPerJob(before, cpuSnapshot(serverPid), settings.saturationJobs);
  return { name, sequential: { ...seq, cpuPerJob: seqCpu }, saturated: { ...saturated, cpuPerJob: cpu } };
}

/** Every scenario gets names of its own, so each starts from empty streams and buckets. */
let scenarios = 0;
const nextPrefix = (tag: string) => `bench${++scenarios}${tag}`;

async function measureRaw(server: NatsServer, name: string): Promise<PathResult> {
  await using raw = await openRawPath(server.url, nextPrefix("raw"), connectOptions);
  // `return await`: the connections must stay open until the measurement is done.
  return await measurePath(name, raw.run, server.pid);
}

/** BullMQ on a redis-server of its own; null (and said why) without one. */
async function measureBullmq(): Promise<PathResult | null> {
  const binary = findRedisServer();
  if (!binary) {
    log("BullMQ: skipped, no redis-server on PATH (Debian: apt-get install redis-server)");
    return null;
  }
  await using redis = await startRedisServer(binary);
  await using bullmq = await openBullmqPath(redis, nextPrefix("bullmq"), settings.workerConcurrency);
  return await measurePath("BullMQ on Redis", bullmq.run, redis.pid);
}

async function measureBoxcar(
  server: NatsServer,
  name: string,
  tag: string,
  providers: SandboxProvider[],
  wait: "watcher" | "sdk" = "watcher",
): Promise<PathResult> {
  await using boxcar = await openBoxcarPath({
    url: server.url,
    prefix: nextPrefix(tag),
    providers,
    concurrency: settings.workerConcurrency,
    connectOptions,
  });
  const result = await measurePath(name, wait === "sdk" ? boxcar.runWithSdk : boxcar.run, server.pid);
  if (boxcar.unsuccessful > 0) throw new Error(`${name}: ${boxcar.unsuccessful} jobs did not succeed; the figures are not valid`);
  return result;
}

/** When the shared watcher saw each revision of the record, counted from the submit. */
type Stage = "accepted" | "queued" | "running (claimed)" | "running (updated)" | "final";
const STAGES: Stage[] = ["accepted", "queued", "running (claimed)", "running (updated)", "final"];

/** The first `running` revision is the worker's claim; later ones are its updates while it runs. */
function stageOf(record: JobRecord, seen: ReadonlyMap<Stage, number>): Stage {
  if (record.state === "accepted") return "accepted";
  if (record.state === "queued") return "queued";
  if (record.state === "running") return seen.has("running (claimed)") ? "running (updated)" : "running (claimed)";
  return "final";
}

interface Breakdown {
  path: string;
  jobs: number;
  roundTrip: LatencySummary;
  /** Median time from the start of the submit until the watcher saw each revision of the record. */
  recordSeenAtMs: Partial<Record<Stage, number>>;
  requests: RoundTripRow[];
  /** Messages each connection sent and received per job (requests, replies, acks, pulls, deliveries). */
  messagesPerJob: Record<string, MessageCounts>;
  /** The same requests counted during a run at the saturation concurrency. */
  underLoad: { jobs: number; requests: RoundTripRow[] };
  /** For comparison: the raw path's requests per job, timed the same way. */
  rawRequests: RoundTripRow[];
  rawMessagesPerJob: Record<string, MessageCounts>;
}

function perJob(before: Record<string, MessageCounts>, after: Record<string, MessageCounts>, jobs: number): Record<string, MessageCounts> {
  return Object.fromEntries(
    Object.entries(after).map(([role, a]) => {
      const b = before[role] ?? { out: 0, in: 0 };
      return [role, { out: (a.out - b.out) / jobs, in: (a.in - b.in) / jobs }];
    }),
  );
}

const countsOf = (conns: Record<string, NatsConnection>) =>
  Object.fromEntries(Object.entries(conns).map(([r, nc]) => [r, messageCounts(nc)]));

/**
 * An instrumented sequential pass (not part of the figures above): every request/reply of every
 * role counted and timed, and the record's revisions timed as the watcher sees them.
 */
async function breakDown(url: string, root: string): Promise<Breakdown> {
  const jobs = settings.profileJobs;
  const prefix = nextPrefix("profile");
  const path = "Boxcar, no spawn (host workspace)";
  log(`breakdown: ${jobs} instrumented jobs on ${path}`);
  await using boxcar: BoxcarPath = await openBoxcarPath({
    url,
    prefix,
    providers: [createInstantSandboxProvider("host-files", root)],
    concurrency: settings.workerConcurrency,
    connectOptions,
  });
  await sequential(boxcar.run, settings.warmupJobs, 0);

  const requests = new RoundTripLog();
  const detach = Object.entries(boxcar.connections).map(([role, nc]) => requests.attach(role, nc, prefix));
  const seen: Record<Stage, number[]> = Object.fromEntries(STAGES.map((s) => [s, []])) as unknown as Record<Stage, number[]>;
  let started = 0;
  let current = new Map<Stage, number>();
  boxcar.listen((record, at) => {
    const stage = stageOf(record, current);
    if (!current.has(stage)) current.set(stage, at - started);
  });
  const before = countsOf(boxcar.connections);
  const latencies: number[] = [];
  for (let i = 0; i < jobs; i++) {
    current = new Map();
    started = performance.now();
    await boxcar.run(settings.warmupJobs + i);
    latencies.push(performance.now() - started);
    for (const [stage, at] of current) seen[stage].push(at);
  }
  const after = countsOf(boxcar.connections);
  boxcar.listen(undefined);
  for (const undo of detach) undo();

  // The same under load: retries after compare-and-swap conflicts show here.
  const loaded = new RoundTripLog();
  const loadedJobs = jobs * 4;
  const loadedDetach = Object.entries(boxcar.connections).map(([role, nc]) => loaded.attach(role, nc, prefix));
  await saturate(boxcar.run, loadedJobs, settings.inFlight, settings.warmupJobs + jobs);
  for (const undo of loadedDetach) undo();

  // The raw path under the same instrument, for a like-for-like count.
  const rawLog = new RoundTripLog();
  await using raw = await openRawPath(url, nextPrefix("raw"), connectOptions);
  await sequential(raw.run, settings.warmupJobs, 1_000_000);
  const rawDetach = Object.entries(raw.connections).map(([role, nc]) => rawLog.attach(role, nc, "raw"));
  const rawBefore = countsOf(raw.connections);
  await sequential(raw.run, jobs, 2_000_000);
  const rawAfter = countsOf(raw.connections);
  for (const undo of rawDetach) undo();

  return {
    path,
    jobs,
    roundTrip: summarize(latencies),
    recordSeenAtMs: Object.fromEntries(STAGES.filter((s) => seen[s].length > 0).map((s) => [s, summarize(seen[s]).p50])),
    requests: requests.rows(jobs),
    messagesPerJob: perJob(before, after, jobs),
    underLoad: { jobs: loadedJobs, requests: loaded.rows(loadedJobs) },
    rawRequests: rawLog.rows(jobs),
    rawMessagesPerJob: perJob(rawBefore, rawAfter, jobs),
  };
}

/**
 * The raw ceiling the ratios are taken against: the better figure of the two raw runs (start and
 * end), so a disturbed raw run never makes Boxcar look closer to the ceiling than it is.
 */
interface Ceiling {
  p50: number;
  p99: number;
  jobsPerSecond: number;
}

function ceilingOf(a: PathResult, b: PathResult): Ceiling {
  return {
    p50: Math.min(a.sequential.p50, b.sequential.p50),
    p99: Math.min(a.sequential.p99, b.sequential.p99),
    jobsPerSecond: Math.max(a.saturated.jobsPerSecond, b.saturated.jobsPerSecond),
  };
}

/** How far a path is from the ceiling: latency ratios, and how many times fewer jobs per second. */
function ratioTo(ceiling: Ceiling, r: PathResult) {
  return {
    p50: r.sequential.p50 / ceiling.p50,
    p99: r.sequential.p99 / ceiling.p99,
    throughput: ceiling.jobsPerSecond / r.saturated.jobsPerSecond,
  };
}

function printResults(
  spawnBare: LatencySummary,
  hostSandbox: LatencySummary,
  raw: PathResult,
  rawAgain: PathResult,
  bullmq: PathResult | null,
  boxcar: PathResult[],
  target: PathResult,
  breakdown: Breakdown,
): void {
  const ceiling = ceilingOf(raw, rawAgain);
  const row = (r: PathResult) => [
    r.name,
    ms(r.sequential.p50),
    ms(r.sequential.p99),
    r.saturated.jobsPerSecond.toFixed(0),
    ms(r.saturated.latency.p50),
    ms(r.saturated.latency.p99),
    ratioTo(ceiling, r).p50.toFixed(2),
    ratioTo(ceiling, r).throughput.toFixed(2),
  ];
  console.log("");
  console.log(
    `No-op job round trip, submit -> final record (ms); ${settings.sequentialJobs} sequential jobs, ${settings.saturationJobs} jobs at ${settings.inFlight} in flight`,
  );
  console.log(
    table([
      [
        "path",
        "seq p50",
        "seq p99",
        `jobs/s @${settings.inFlight}`,
        `p50 @${settings.inFlight}`,
        `p99 @${settings.inFlight}`,
        "p50 / raw",
        "raw jobs/s / jobs/s",
      ],
      row(raw),
      ...(bullmq ? [row(bullmq)] : []),
      ...boxcar.map(row),
      row(rawAgain),
    ]),
  );
  console.log("");
  console.log(
    `CPU ms per job: the bench process (user+system, all threads) and nats-server (for BullMQ, redis-server); and CPUs kept busy by the rest of the machine`,
  );
  const cores = (n: number | null) => (n === null ? "-" : n.toFixed(2));
  const cpuMs = (n: number | null) => (n === null ? "-" : ms(n));
  const cpuRow = (r: PathResult) => {
    const seq = r.sequential.cpuPerJob;
    const sat = r.saturated.cpuPerJob;
    return [
      r.name,
      ms(seq.nodeUserMs + seq.nodeSystemMs),
      cpuMs(seq.serverMs),
      ms(sat.nodeUserMs),
      ms(sat.nodeSystemMs),
      cpuMs(sat.serverMs),
      cores(seq.otherCores),
      cores(sat.otherCores),
    ];
  };
  const at = `@${settings.inFlight}`;
  console.log(
    table([
      ["path", "seq node", "seq server", `${at} node user`, `${at} node sys`, `${at} server`, "other CPUs seq", `other CPUs ${at}`],
      cpuRow(raw),
      ...(bullmq ? [cpuRow(bullmq)] : []),
      ...boxcar.map(cpuRow),
      cpuRow(rawAgain),
    ]),
  );
  console.log("");
  console.log(`bare host spawn of \`true\`: p50 ${ms(spawnBare.p50)} ms, p99 ${ms(spawnBare.p99)} ms`);
  console.log(
    `host sandbox create + layout + exec \`true\` + destroy (no NATS): p50 ${ms(hostSandbox.p50)} ms, p99 ${ms(hostSandbox.p99)} ms`,
  );
  const { p50: p50Ratio, throughput: rateRatio } = ratioTo(ceiling, target);
  const met = p50Ratio <= 2 && rateRatio <= 2;
  console.log("");
  console.log(
    `raw ceiling (the better of the two raw runs): p50 ${ms(ceiling.p50)} ms, ${ceiling.jobsPerSecond.toFixed(0)} jobs/s; ratios in the table are to it`,
  );
  console.log(
    `2x target (${target.name} vs raw): p50 ${p50Ratio.toFixed(2)}x, throughput ${rateRatio.toFixed(2)}x lower -> ${met ? "MET" : "NOT MET"}`,
  );

  console.log("");
  console.log(`Breakdown: ${breakdown.jobs} sequential jobs on ${breakdown.path}, every request/reply counted and timed`);
  const requestRows = (rows: RoundTripRow[]) =>
    rows.map((r) => [r.role, r.op, r.perJob.toFixed(2), ms(r.p50Ms), ms(r.meanMs), ms(r.msPerJob), r.detail.join(" ")]);
  const requestHeader = ["role", "request/reply", "per job", "p50 ms", "mean ms", "ms/job", "detail"];
  console.log(table([requestHeader, ...requestRows(breakdown.requests)]));
  const total = (rows: RoundTripRow[], role: string) => rows.filter((r) => r.role === role).reduce((a, r) => a + r.perJob, 0);
  console.log(
    `request/replies per job: client ${total(breakdown.requests, "client").toFixed(1)}, dispatcher ${total(breakdown.requests, "dispatcher").toFixed(1)}, worker ${total(breakdown.requests, "worker").toFixed(1)} (+1 ackAck, not counted by the wrapper)`,
  );
  console.log(
    `messages per job (out/in): ${Object.entries(breakdown.messagesPerJob)
      .map(([role, c]) => `${role} ${c.out.toFixed(1)}/${c.in.toFixed(1)}`)
      .join(", ")}`,
  );
  console.log(
    `record revisions seen by the watcher, ms after the submit (p50): ${Object.entries(breakdown.recordSeenAtMs)
      .map(([stage, at]) => `${stage} ${ms(at)}`)
      .join(", ")}; round trip p50 ${ms(breakdown.roundTrip.p50)}`,
  );
  console.log("");
  console.log(`The same, ${breakdown.underLoad.jobs} jobs at ${settings.inFlight} in flight (waits include queueing):`);
  console.log(table([requestHeader, ...requestRows(breakdown.underLoad.requests)]));
  console.log("");
  console.log("Raw path, same instrument:");
  console.log(table([requestHeader, ...requestRows(breakdown.rawRequests)]));
  console.log(
    `messages per job (out/in): ${Object.entries(breakdown.rawMessagesPerJob)
      .map(([role, c]) => `${role} ${c.out.toFixed(1)}/${c.in.toFixed(1)}`)
      .join(", ")}`,
  );
}

async function main(): Promise<void> {
  const startedAt = new Date();
  const server: NatsServer = await startNatsServer();
  const root = await mkdtemp(join(settings.workRoot, "boxcar-bench-"));
  try {
    log(
      `nats-server on ${server.url}, store ${server.storeDir}; workspaces under ${root}; async traces ${settings.asyncTraces ? "on" : "off"}`,
    );
    log("host spawn");
    const spawnBare = await measureBareSpawn(root, 500, 50);
    const hostSandbox = await measureHostSandbox(root, 500, 50);

    const raw = await measureRaw(server, "raw JetStream");
    const bullmq = await measureBullmq();
    const host = await measureBoxcar(server, "Boxcar, host sandbox (`true`)", "host", [createHostSandboxProvider({ root })]);
    const noSpawn = await measureBoxcar(server, "Boxcar, no spawn (host workspace)", "nospawn", [
      createInstantSandboxProvider("host-files", root),
    ]);
    const memory = await measureBoxcar(server, "Boxcar, no spawn (memory workspace)", "memory", [
      createInstantSandboxProvider("memory", root),
    ]);
    // As a user's program waits: `client.waitForJob` (a subscription and reads per job) instead of the shared watcher.
    const sdk = await measureBoxcar(
      server,
      "Boxcar, no spawn (memory workspace), SDK wait",
      "sdk",
      [createInstantSandboxProvider("memory", root)],
      "sdk",
    );
    const rawAgain = await measureRaw(server, "raw JetStream (again, at the end)");
    const breakdown = await breakDown(server.url, root);

    const probe = await connect({ servers: server.url });
    const natsServerVersion = probe.info?.version ?? "unknown";
    await probe.close();

    printResults(spawnBare, hostSandbox, raw, rawAgain, bullmq, [host, noSpawn, memory, sdk], noSpawn, breakdown);

    const ceiling = ceilingOf(raw, rawAgain);
    const ratio = (r: PathResult) => ratioTo(ceiling, r);
    const results = {
      startedAt: startedAt.toISOString(),
      finishedAt: new Date().toISOString(),
      machine: {
        cpus: cpus().length,
        cpuModel: cpus()[0]?.model ?? "unknown",
        memoryGiB: Math.round(totalmem() / 1024 ** 3),
        platform: `${process.platform} ${process.arch}`,
        node: process.version,
        natsServer: natsServerVersion,
      },
      source: sourceVersion(),
      settings,
      arrangement:
        "one process: raw submitter, raw worker, Boxcar client, dispatcher and worker each on their own NATS connection; nats-server is a child process",
      hostSpawn: { bare: spawnBare, hostSandboxLifecycle: hostSandbox },
      paths: { raw, bullmq, host, noSpawn, memory, sdk, rawAgain },
      rawCeiling: ceiling,
      ratiosToRaw: {
        ...(bullmq ? { bullmq: ratio(bullmq) } : {}),
        host: ratio(host),
        noSpawn: ratio(noSpawn),
        memory: ratio(memory),
        sdk: ratio(sdk),
      },
      target: {
        path: noSpawn.name,
        p50Ratio: ratio(noSpawn).p50,
        throughputRatio: ratio(noSpawn).throughput,
        met: ratio(noSpawn).p50 <= 2 && ratio(noSpawn).throughput <= 2,
      },
      breakdown,
    };
    const dir = new URL("../results/", import.meta.url).pathname;
    await mkdir(dir, { recursive: true });
    const file = join(dir, `${startedAt.toISOString().replace(/[:.]/g, "-")}.json`);
    await writeFile(file, `${JSON.stringify(results, null, 2)}\n`);
    console.log("");
    console.log(`results written to ${file}`);
  } finally {
    await server.stop();
    await rm(root, { recursive: true, force: true });
  }
}

await main();
