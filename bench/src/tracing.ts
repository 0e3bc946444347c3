/**
 * What metrics and tracing cost a job: the memory-workspace no-op path (bench/src/instant-sandbox.ts:
 * all of Boxcar but the agent process and the file system) at saturation, in arms run interleaved,
 * round by round, against one nats-server, each measurement on a fresh system (a prefix of its
 * own, its streams deleted after it) and in a fresh Node.js process, so that nothing one arm loads
 * or starts (the OpenTelemetry SDK, prom-client's process collectors) stays behind for the next:
 *
 * - `baseline`: no metrics, no tracing;
 * - `metrics`: the dispatcher and the worker each serve their metrics as `--metrics ADDR` does
 *   (the CLI's own `MetricsEndpoint`: a registry with prom-client's process collectors, an HTTP
 *   server listening; the role's metrics kept in it), tracing off (no SDK loaded, the API's
 *   no-ops); not scraped during the measurement, as with a scrape every 15 s or more;
 * - `scraped`: the same, each endpoint scraped every BENCH_SCRAPE_MS (default 1000: far more often
 *   than Prometheus would, so the cost of a scrape shows);
 * - `tracing`: no metrics, tracing on (the SDK's BatchSpanProcessor, every span recorded, dropped
 *   at export);
 * - `registries` (not run by default): the roles keep their metrics in plain registries, without
 *   the endpoint and prom-client's process collectors (as BENCH_METRICS=1 does for `pnpm bench`),
 *   to tell which part of `metrics` costs.
 *
 * `pnpm bench:tracing`; BENCH_TRACING_ARMS (default baseline,metrics,scraped,tracing),
 * BENCH_TRACING_ROUNDS rounds (default 8; the arms' order rotates each round), BENCH_M jobs
 * measured at 64 in flight (default 3000), BENCH_N jobs measured one at a time (default 300),
 * BENCH_WARMUP jobs (default 1000) before them in each process. The summary is given over all
 * rounds and over the quiet ones (BENCH_QUIET: the rest of the machine kept at most 0.1 of a CPU
 * busy during both the arm's and the baseline's measurement), for a shared machine.
 */
import { fork } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { get } from "node:http";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
// The CLI's own endpoint behind `--metrics` (not exported by @boxcar/cli: reached by its path).
import { MetricsEndpoint } from "@boxcar/cli";
import { type Logger, silentLogger } from "@boxcar/common";
import { startNatsServer } from "@boxcar/fabric";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { trace } from "@opentelemetry/api";
import type { BasicTracerProvider, SpanExporter } from "@opentelemetry/sdk-trace-base";
import { Registry } from "prom-client";
import { openBoxcarPath } from "./boxcar-path.js";
import { cpuPerJob, cpuSnapshot } from "./cpu.js";
import { createInstantSandboxProvider } from "./instant-sandbox.js";
import { saturate, sequential } from "./load.js";
import { envInt, gitCommit, ms, summarize, table } from "./stats.js";

const ARMS = {
  baseline: { metrics: "none", scrape: false, tracing: false, label: "baseline: no metrics, no tracing" },
  metrics: { metrics: "served", scrape: false, tracing: false, label: "metrics served, tracing off" },
  scraped: { metrics: "served", scrape: true, tracing: false, label: "metrics served and scraped, tracing off" },
  tracing: { metrics: "none", scrape: false, tracing: true, label: "no metrics, tracing on" },
  registries: { metrics: "registries", scrape: false, tracing: false, label: "role metrics only (no endpoint), tracing off" },
} as const;
type Arm = keyof typeof ARMS;

const JOBS = envInt("BENCH_M", 3000);
const SEQUENTIAL = envInt("BENCH_N", 300);
const WARMUP = envInt("BENCH_WARMUP", 1000);
const SCRAPE_MS = envInt("BENCH_SCRAPE_MS", 1000);
const IN_FLIGHT = 64;
/** A measurement is quiet when the rest of the machine kept at most this much of a CPU busy meanwhile. */
const QUIET = Number(process.env.BENCH_QUIET || 0.1);
/** The bound the arms are held to (issue 15: metrics on and tracing off within 3% of the throughput). */
const BOUND = 0.03;

/** What one measurement (one arm, one round, one process) found. */
interface Measurement {
  arm: Arm;
  jobsPerSecond: number;
  /** Round trip at 64 in flight (queueing included) and one at a time, ms. */
  p50: number;
  p99: number;
  sequentialP50: number;
  /** CPU ms per job at 64 in flight: this process (every role and the client), nats-server; other CPUs busy. */
  nodeCpuMs: number;
  serverCpuMs: number | null;
  otherCores: number | null;
  /**
   * Spans recorded (tracing); scrapes answered during the measurement at 64 in flight; attempts
   * the worker's endpoint counted (metrics).
   */
  spans: number;
  scrapes: number;
  /** The median scrape's duration, ms (NaN: none). */
  scrapeMs: number;
  attemptsCounted: number | null;
}

/** The middle value (of an even count, the mean of the two in the middle); NaN for none. */
function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  if (sorted.length === 0) return Number.NaN;
  return sorted.length % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

// --- one measurement, in a process of its own -------------------------------------------------

/** A `--metrics` endpoint as a role opens it, on a free port of 127.0.0.1; says where it listens. */
async function servedMetrics(): Promise<{ endpoint: MetricsEndpoint; url: string }> {
  let bound = "";
  const log: Logger = {
    ...silentLogger,
    info(obj) {
      const address = (obj as { metrics?: string }).metrics;
      if (address) bound = address;
    },
  };
  const endpoint = (await MetricsEndpoint.open({ host: "127.0.0.1", port: 0 }, log)) as MetricsEndpoint;
  return { endpoint, url: `http://${bound}/metrics` };
}

/**
 * A scrape's text, checked: a plain `http.get`, as light a client as can be (Prometheus would be
 * a process of its own; what its client costs is not Boxcar's).
 */
function scrape(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    get(url, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        text += chunk;
      });
      res.on("end", () => (res.statusCode === 200 ? resolve(text) : reject(new Error(`scrape of ${url}: HTTP ${res.statusCode}`))));
      res.on("error", reject);
    }).on("error", reject);
  });
}

/** The sum of a counter's series in a scrape. */
function counterSum(text: string, name: string): number {
  let sum = 0;
  for (const line of text.split("\n"))
    if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.split(" ").at(-1));
  return sum;
}

async function measure(arm: Arm): Promise<Measurement> {
  const spec = ARMS[arm];
  const env = (name: string) => process.env[name] ?? "";
  let spans = 0;
  let provider: BasicTracerProvider | undefined;
  if (spec.tracing) {
    // Loaded only in this arm: the others never have the SDK in their process.
    const { BasicTracerProvider, BatchSpanProcessor } = await import("@opentelemetry/sdk-trace-base");
    /** Counts the spans and drops them: what is measured is making and batching them, not a collector. */
    const discard: SpanExporter = {
      export(batch, done) {
        spans += batch.length;
        done({ code: 0 });
      },
      shutdown: async () => {},
    };
    provider = new BasicTracerProvider({ spanProcessors: [new BatchSpanProcessor(discard)] });
    trace.setGlobalTracerProvider(provider);
  } else if (trace.getTracer("bench").startSpan("probe").isRecording()) {
    throw new Error(`${arm}: a tracer provider records spans, but tracing should be off`);
  }

  const endpoints = spec.metrics === "served" ? { dispatcher: await servedMetrics(), worker: await servedMetrics() } : undefined;
  // `registries`: the roles keep their metrics in plain registries, no endpoint and no process collectors.
  const registries =
    spec.metrics === "registries"
      ? { dispatcher: new Registry(), worker: new Registry() }
      : endpoints && { dispatcher: endpoints.dispatcher.endpoint.registry, worker: endpoints.worker.endpoint.registry };
  /** Scrapes that started while the jobs at 64 in flight were measured, and how long each took (ms). */
  const scrapes: number[] = [];
  let measuring = false;
  let scraping: NodeJS.Timeout | undefined;
  const failures: unknown[] = [];
  if (endpoints && spec.scrape) {
    scraping = setInterval(() => {
      for (const { url } of Object.values(endpoints)) {
        const counted = measuring;
        const start = performance.now();
        scrape(url).then(
          () => counted && scrapes.push(performance.now() - start),
          (err: unknown) => failures.push(err),
        );
      }
    }, SCRAPE_MS);
  }
  try {
    await using boxcar = await openBoxcarPath({
      url: env("BENCH_TRACING_URL"),
      prefix: env("BENCH_TRACING_PREFIX"),
      providers: [createInstantSandboxProvider("memory", env("BENCH_TRACING_ROOT"))],
      concurrency: IN_FLIGHT,
      connectOptions: { noAsyncTraces: true },
      ...(registries ? { metrics: registries } : {}),
    });
    // A fresh process: warm it (JIT, buffers) before measuring.
    let next = 0;
    const take = (n: number) => {
      const first = next;
      next += n;
      return first;
    };
    await sequential(boxcar.run, 200, take(200));
    await saturate(boxcar.run, WARMUP, IN_FLIGHT, take(WARMUP));
    // The first scrape of each endpoint (modules, code paths run once) is part of the warm-up too.
    if (endpoints) for (const { url } of Object.values(endpoints)) await scrape(url);

    const serverPid = Number(env("BENCH_TRACING_SERVER_PID"));
    const before = cpuSnapshot(serverPid);
    measuring = true;
    const saturated = await saturate(boxcar.run, JOBS, IN_FLIGHT, take(JOBS));
    measuring = false;
    const cpu = cpuPerJob(before, cpuSnapshot(serverPid), JOBS);
    const oneAtATime = summarize(await sequential(boxcar.run, SEQUENTIAL, take(SEQUENTIAL)));
    clearInterval(scraping);
    await provider?.forceFlush();
    if (boxcar.unsuccessful > 0) throw new Error(`${arm}: ${boxcar.unsuccessful} jobs did not succeed; the run is not valid`);
    if (failures.length > 0) throw new Error(`${arm}: ${failures.length} scrapes failed, the first: ${String(failures[0])}`);
    // The metrics were kept: the worker's endpoint counts every attempt run here.
    const attemptsCounted = endpoints ? counterSum(await scrape(endpoints.worker.url), "boxcar_worker_attempts_total") : null;
    return {
      arm,
      jobsPerSecond: saturated.jobsPerSecond,
      p50: saturated.latency.p50,
      p99: saturated.latency.p99,
      sequentialP50: oneAtATime.p50,
      nodeCpuMs: cpu.nodeUserMs + cpu.nodeSystemMs,
      serverCpuMs: cpu.serverMs,
      otherCores: cpu.otherCores,
      spans,
      scrapes: scrapes.length,
      scrapeMs: median(scrapes),
      attemptsCounted,
    };
  } finally {
    clearInterval(scraping);
    await provider?.shutdown();
    for (const { endpoint } of Object.values(endpoints ?? {})) await endpoint[Symbol.asyncDispose]();
  }
}

// --- the rounds, in the parent -----------------------------------------------------------------

/** Runs one measurement in a child process (this file again) and gives back what it found. */
function measureInChild(arm: Arm, env: Record<string, string>): Promise<Measurement> {
  return new Promise((resolve, reject) => {
    const child = fork(fileURLToPath(import.meta.url), [], { env: { ...process.env, ...env, BENCH_TRACING_ARM: arm } });
    let result: Measurement | undefined;
    child.on("message", (message) => {
      result = message as Measurement;
    });
    child.on("error", reject);
    child.on("exit", (code) =>
      code === 0 && result ? resolve(result) : reject(new Error(`${arm}: the measurement's process exited with ${code}`)),
    );
  });
}

const percent = (ratio: number) => `${ratio >= 1 ? "+" : ""}${((ratio - 1) * 100).toFixed(1)}%`;

async function main(): Promise<void> {
  const arms = (process.env.BENCH_TRACING_ARMS || "baseline,metrics,scraped,tracing").split(",").map((a) => a.trim()) as Arm[];
  for (const arm of arms) if (!(arm in ARMS)) throw new RangeError(`BENCH_TRACING_ARMS: unknown arm ${JSON.stringify(arm)}`);
  if (arms[0] !== "baseline") throw new RangeError("BENCH_TRACING_ARMS must start with baseline: the others are compared to it");
  const rounds = envInt("BENCH_TRACING_ROUNDS", 8);
  const startedAt = new Date();
  const server = await startNatsServer();
  const root = await mkdtemp(join(tmpdir(), "boxcar-bench-tracing-"));
  const results: Measurement[][] = [];
  try {
    for (let round = 0; round < rounds; round++) {
      // The order rotates, so each arm runs first, second... as often, and a drift of the machine falls on all.
      const order = arms.map((_, i) => arms[(i + round) % arms.length] as Arm);
      const found: Measurement[] = [];
      for (const arm of order) {
        const m = await measureInChild(arm, {
          BENCH_TRACING_URL: server.url,
          BENCH_TRACING_SERVER_PID: String(server.pid),
          BENCH_TRACING_PREFIX: `benchtracing${round}${arm}`,
          BENCH_TRACING_ROOT: root,
        });
        found.push(m);
        // Every measurement starts on an empty server: what the ones before stored is deleted.
        const nc = await connect({ servers: server.url });
        const jsm = await jetstreamManager(nc);
        for await (const stream of jsm.streams.list()) await jsm.streams.delete(stream.config.name);
        await nc.close();
        process.stdout.write(
          `round ${round + 1} ${arm.padEnd(10)} ${m.jobsPerSecond.toFixed(0).padStart(5)} jobs/s, p50 @${IN_FLIGHT} ${ms(m.p50)} ms, p50 one at a time ${ms(m.sequentialP50)} ms, CPU/job ${ms(m.nodeCpuMs)} ms (nats-server ${m.serverCpuMs === null ? "-" : ms(m.serverCpuMs)}), other CPUs ${m.otherCores?.toFixed(2) ?? "-"}${m.spans ? `, ${m.spans} spans` : ""}${m.attemptsCounted !== null ? `, ${m.attemptsCounted} attempts counted` : ""}${m.scrapes ? `, ${m.scrapes} scrapes (median ${ms(m.scrapeMs)} ms)` : ""}\n`,
        );
      }
      results.push(arms.map((arm) => found.find((m) => m.arm === arm) as Measurement));
    }
  } finally {
    await rm(root, { recursive: true, force: true });
    await server.stop();
  }

  const index = (arm: Arm) => arms.indexOf(arm);
  const quiet = (m: Measurement) => m.otherCores !== null && m.otherCores <= QUIET;
  /** An arm's figures over `rounds`, and their ratios to the baseline of the same rounds. */
  const summarizeArm = (arm: Arm, rounds: Measurement[][]) => {
    const own = rounds.map((round) => round[index(arm)] as Measurement);
    const ratios = (f: (m: Measurement) => number) =>
      rounds.map((round) => f(round[index(arm)] as Measurement) / f(round[0] as Measurement));
    const rate = ratios((m) => m.jobsPerSecond);
    return {
      arm,
      label: ARMS[arm].label,
      rounds: rounds.length,
      jobsPerSecond: median(own.map((m) => m.jobsPerSecond)),
      jobsPerSecondRange: [Math.min(...own.map((m) => m.jobsPerSecond)), Math.max(...own.map((m) => m.jobsPerSecond))],
      p50: median(own.map((m) => m.p50)),
      sequentialP50: median(own.map((m) => m.sequentialP50)),
      nodeCpuMs: median(own.map((m) => m.nodeCpuMs)),
      throughputRatio: median(rate),
      throughputRatioRange: [Math.min(...rate), Math.max(...rate)],
      roundsBeyondBound: rate.filter((r) => r < 1 - BOUND).length,
      p50Ratio: median(ratios((m) => m.p50)),
      sequentialP50Ratio: median(ratios((m) => m.sequentialP50)),
      cpuRatio: median(ratios((m) => m.nodeCpuMs)),
    };
  };
  type ArmSummary = ReturnType<typeof summarizeArm>;
  const all = arms.map((arm) => summarizeArm(arm, results));
  // Only the rounds where neither this arm's measurement nor the baseline's shared the machine.
  const quietOnly = arms.map((arm) =>
    summarizeArm(
      arm,
      results.filter((round) => quiet(round[0] as Measurement) && quiet(round[index(arm)] as Measurement)),
    ),
  );

  const na = (s: ArmSummary, text: () => string) => (s.arm === "baseline" || s.rounds === 0 ? "" : text());
  const summaryTable = (summary: ArmSummary[]) =>
    table([
      [
        "arm",
        "rounds",
        "jobs/s",
        `p50 @${IN_FLIGHT} ms`,
        "p50 one at a time ms",
        "CPU ms/job",
        "jobs/s vs baseline",
        `p50 @${IN_FLIGHT} vs baseline`,
        "p50 one at a time vs baseline",
        "CPU/job vs baseline",
      ],
      ...summary.map((s) => [
        s.label,
        String(s.rounds),
        s.rounds === 0 ? "-" : `${s.jobsPerSecond.toFixed(0)} (${s.jobsPerSecondRange.map((v) => v.toFixed(0)).join("-")})`,
        ms(s.p50),
        ms(s.sequentialP50),
        ms(s.nodeCpuMs),
        na(s, () => `${percent(s.throughputRatio)} (${s.throughputRatioRange.map(percent).join(" to ")})`),
        na(s, () => percent(s.p50Ratio)),
        na(s, () => percent(s.sequentialP50Ratio)),
        na(s, () => percent(s.cpuRatio)),
      ]),
    ]);
  const verdict = (s: ArmSummary, which: string) =>
    s.rounds === 0
      ? `${s.label}, ${which}: no round to tell\n`
      : `${s.label}, ${which}: ${percent(s.throughputRatio)} throughput at the median of ${s.rounds} rounds -> ${s.throughputRatio >= 1 - BOUND ? "within" : "NOT within"} issue 15's ${BOUND * 100}% at the median; ${s.roundsBeyondBound} of ${s.rounds} rounds beyond it\n`;

  process.stdout.write(
    `\n${rounds} rounds, ${JOBS} no-op jobs at ${IN_FLIGHT} in flight and ${SEQUENTIAL} one at a time per arm and round (memory workspace, ${cpus().length} CPUs, ${gitCommit()})\n\n`,
  );
  process.stdout.write(
    `jobs/s at ${IN_FLIGHT} in flight, per round (* the rest of the machine kept more than ${QUIET} of a CPU busy):\n${table([
      ["arm", ...results.map((_, r) => `round ${r + 1}`)],
      ...arms.map((arm) => [
        arm,
        ...results.map((round) => round[index(arm)] as Measurement).map((m) => `${quiet(m) ? "" : "*"}${m.jobsPerSecond.toFixed(0)}`),
      ]),
    ])}\n\n`,
  );
  process.stdout.write(
    `All rounds: medians; "vs baseline": the median of the rounds' ratios to the baseline of the same round (range in brackets)\n${summaryTable(all)}\n\n`,
  );
  process.stdout.write(
    `Quiet rounds only (this arm's and the baseline's measurements both with other CPUs <= ${QUIET}):\n${summaryTable(quietOnly)}\n\n`,
  );
  for (const [i, s] of all.entries()) {
    if (s.arm === "baseline") continue;
    process.stdout.write(verdict(s, "all rounds"));
    process.stdout.write(verdict(quietOnly[i] as ArmSummary, "quiet rounds"));
  }
  const dir = new URL("../results/", import.meta.url).pathname;
  await mkdir(dir, { recursive: true });
  const file = join(dir, `tracing-${startedAt.toISOString().replace(/[:.]/g, "-")}.json`);
  await writeFile(
    file,
    `${JSON.stringify({ startedAt, finishedAt: new Date(), commit: gitCommit(), cpus: cpus().length, settings: { arms, rounds, jobs: JOBS, quiet: QUIET, sequential: SEQUENTIAL, warmup: WARMUP, scrapeMs: SCRAPE_MS, inFlight: IN_FLIGHT }, summary: all, quietSummary: quietOnly, rounds: results }, null, 2)}\n`,
  );
  process.stdout.write(`results written to ${file}\n`);
}

const arm = process.env.BENCH_TRACING_ARM as Arm | undefined;
if (arm) {
  const found = await measure(arm);
  // Handed to the parent, then this process ends (the IPC channel would keep it alive).
  await new Promise<void>((resolve, reject) => process.send?.(found, (err: Error | null) => (err ? reject(err) : resolve())));
  process.disconnect?.();
} else {
  await main();
}
