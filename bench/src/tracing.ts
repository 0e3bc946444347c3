/**
 * What tracing costs a job: the memory-workspace no-op path (bench/src/instant-sandbox.ts: all of
 * Boxcar but the agent process and the file system) at saturation, with no tracer provider
 * ("off": OpenTelemetry's no-op API) and with one that records every span ("on": the SDK's
 * BatchSpanProcessor, spans dropped at export), interleaved round by round in one process, each
 * measurement on a fresh system.
 * `pnpm bench:tracing`; BENCH_TRACING_ROUNDS rounds (default 6) of BENCH_M jobs (default 3000).
 */
import { mkdtemp, rm } from "node:fs/promises";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { startNatsServer } from "@boxcar/fabric";
import { trace } from "@opentelemetry/api";
import { BasicTracerProvider, BatchSpanProcessor, type SpanExporter } from "@opentelemetry/sdk-trace-base";
import { openBoxcarPath } from "./boxcar-path.js";
import { createInstantSandboxProvider } from "./instant-sandbox.js";
import { saturate, sequential } from "./load.js";
import { envInt, ms, table } from "./stats.js";

const ROUNDS = envInt("BENCH_TRACING_ROUNDS", 6);
const JOBS = envInt("BENCH_M", 3000);
const IN_FLIGHT = 64;

let exported = 0;
/** Counts the spans and drops them: what is measured is making and batching them, not a collector. */
const discard: SpanExporter = {
  export(spans, done) {
    exported += spans.length;
    done({ code: 0 });
  },
  shutdown: async () => {},
};

const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? Number.NaN;

const server = await startNatsServer();
const root = await mkdtemp(join(tmpdir(), "boxcar-bench-tracing-"));
try {
  const rates = { off: [] as number[], on: [] as number[] };
  const p50 = { off: [] as number[], on: [] as number[] };
  const ratios: number[] = [];
  let unsuccessful = 0;
  for (let round = 0; round < ROUNDS; round++) {
    const round_ = { off: 0, on: 0 };
    // Alternate which goes first, so a drift of the machine falls on both; each measurement on a
    // system of its own (a fresh prefix), so none runs on the jobs the ones before it left.
    for (const mode of round % 2 === 0 ? (["off", "on"] as const) : (["on", "off"] as const)) {
      let provider: BasicTracerProvider | undefined;
      if (mode === "on") {
        provider = new BasicTracerProvider({ spanProcessors: [new BatchSpanProcessor(discard)] });
        trace.setGlobalTracerProvider(provider);
      }
      await using boxcar = await openBoxcarPath({
        url: server.url,
        prefix: `benchtracing${round}${mode}`,
        providers: [createInstantSandboxProvider("memory", root)],
        concurrency: IN_FLIGHT,
        connectOptions: { noAsyncTraces: true },
      });
      await sequential(boxcar.run, 200);
      const result = await saturate(boxcar.run, JOBS, IN_FLIGHT, 200);
      await provider?.forceFlush();
      trace.disable();
      unsuccessful += boxcar.unsuccessful;
      rates[mode].push(result.jobsPerSecond);
      p50[mode].push(result.latency.p50);
      round_[mode] = result.jobsPerSecond;
      process.stdout.write(`round ${round + 1} ${mode}: ${result.jobsPerSecond.toFixed(0)} jobs/s, p50 ${ms(result.latency.p50)} ms\n`);
    }
    ratios.push(round_.on / round_.off);
  }
  if (unsuccessful > 0) throw new Error(`${unsuccessful} jobs did not succeed: the run is not valid`);
  const cost = (1 - median(ratios)) * 100;
  process.stdout.write(
    `\nTracing, ${ROUNDS} rounds of ${JOBS} no-op jobs at ${IN_FLIGHT} in flight (memory workspace, ${cpus().length} CPUs)\n\n${table([
      ["tracing", "jobs/s (median)", "p50 ms (median)"],
      ["off (no tracer provider)", median(rates.off).toFixed(0), ms(median(p50.off))],
      ["on (every span recorded and batched)", median(rates.on).toFixed(0), ms(median(p50.on))],
    ])}\n\nOn costs ${cost.toFixed(1)}% of the throughput (median of the rounds' on/off ratios); ${exported} spans recorded (${(exported / (ROUNDS * (JOBS + 200))).toFixed(1)} per job).\n`,
  );
} finally {
  await rm(root, { recursive: true, force: true });
  await server.stop();
}
