/**
 * What a job's metric updates cost in CPU, apart from everything else a job does: the
 * dispatcher's and the worker's real metrics classes, updated as one job updates them (admitted,
 * claimed, sandbox created, attempt ended), a million times, against the same loop without
 * metrics, alternated. `pnpm bench:metric-updates`; docs/benchmarks.md "Metrics and tracing".
 */

import { DispatcherMetrics } from "@boxcar/dispatcher";
import type { Topology } from "@boxcar/fabric";
import { WorkerMetrics } from "@boxcar/worker";
import { Registry } from "prom-client";

const JOBS = Number(process.env.BENCH_N ?? 1_000_000);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);

const registry = new Registry();
// The topology and job counts are read only when scraped, which this bench does not do.
const dispatcher = new DispatcherMetrics(registry, {} as Topology, () => ({}) as never);
const worker = new WorkerMetrics(registry, () => ({ running: 0, capacity: 1, warm: 0 }));
const admitted = { job: { agent: "noop", pool: "default" }, duplicate: false };
const admit = async () => admitted;
const queuedAt = "2026-11-25T21:00:00.000Z";
const startedAt = "2026-11-25T21:00:00.012Z";

async function withoutMetrics(i: number): Promise<void> {
  await admit();
  void i;
}

async function withMetrics(i: number): Promise<void> {
  await dispatcher.admission(admit);
  worker.claimed("default", queuedAt, startedAt);
  worker.sandboxCreated("host", 1 + (i % 3), undefined);
  worker.attemptEnded("noop", "default", "succeeded", { ms: 20 + (i % 7), cpuMs: undefined, artifactBytes: 0 });
}

async function microsPerJob(perJob: (i: number) => Promise<void>): Promise<number> {
  const started = process.cpuUsage();
  for (let i = 0; i < JOBS; i++) await perJob(i);
  const used = process.cpuUsage(started);
  return (used.user + used.system) / JOBS;
}

const off: number[] = [];
const on: number[] = [];
await microsPerJob(withMetrics); // warm-up of both paths
await microsPerJob(withoutMetrics);
for (let round = 1; round <= ROUNDS; round++) {
  off.push(await microsPerJob(withoutMetrics));
  on.push(await microsPerJob(withMetrics));
  console.log(`round ${round}: without ${off.at(-1)?.toFixed(3)} µs, with ${on.at(-1)?.toFixed(3)} µs of CPU per job`);
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const added = median(on.map((x, i) => x - (off[i] as number)));
console.log(`\nmetric updates add ${added.toFixed(2)} µs of CPU per job (median of ${ROUNDS} rounds of ${JOBS} jobs)`);
