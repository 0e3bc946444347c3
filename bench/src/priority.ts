/**
 * Priorities benchmark: what a job's priority buys and what it costs, against one nats-server
 * started here, on the memory-workspace path (no process, no files: Boxcar's own overhead only).
 * Run it with `pnpm bench:priority`; docs/benchmarks.md has the figures and what they mean.
 *
 * 1. Idle pickup: jobs one at a time to an idle worker, the three priorities in turn. An idle
 *    worker waits with a pull on each priority's consumer, so each priority should be picked
 *    up as fast as the others.
 * 2. Jumping the queue: a backlog of BENCH_BACKLOG low jobs is queued; right after it, probe
 *    jobs are submitted together, as `high` and, in a second run, as `low`. A high probe should
 *    wait for free slots, not for the backlog; a low one waits for the backlog.
 *
 * Environment: BENCH_N (idle jobs per priority, default 300), BENCH_BACKLOG (default 3000),
 * BENCH_PROBES (probes per run, default 20), BENCH_CONCURRENCY (the worker's, default 4).
 */
import { tmpdir } from "node:os";
import { type NatsServer, startNatsServer } from "@boxcar/fabric";
import type { Priority } from "@boxcar/protocol";
import { type BoxcarPath, openBoxcarPath } from "./boxcar-path.js";
import { createInstantSandboxProvider } from "./instant-sandbox.js";
import { envInt, type LatencySummary, ms, summarize, table } from "./stats.js";

const settings = {
  idleJobs: envInt("BENCH_N", 300),
  backlog: envInt("BENCH_BACKLOG", 3000),
  probes: envInt("BENCH_PROBES", 20),
  concurrency: envInt("BENCH_CONCURRENCY", 4),
};
const PRIORITIES: Priority[] = ["high", "normal", "low"];
const log = (line: string) => process.stderr.write(`${line}\n`);
let scenarios = 0;

async function open(server: NatsServer): Promise<BoxcarPath> {
  return openBoxcarPath({
    url: server.url,
    prefix: `benchprio${++scenarios}`,
    providers: [createInstantSandboxProvider("memory", tmpdir())],
    concurrency: settings.concurrency,
  });
}

async function roundTrip(path: BoxcarPath, i: number, priority: Priority): Promise<number> {
  const start = performance.now();
  await path.done(await path.submit(i, { priority }));
  return performance.now() - start;
}

/** Jobs one at a time to an idle worker, cycling through the priorities. */
async function idlePickup(server: NatsServer): Promise<Record<Priority, LatencySummary>> {
  await using path = await open(server);
  for (let i = 0; i < 100; i++) await roundTrip(path, i, PRIORITIES[i % 3] as Priority); // warm-up
  const samples: Record<Priority, number[]> = { high: [], normal: [], low: [] };
  for (let i = 0; i < settings.idleJobs * 3; i++) {
    const priority = PRIORITIES[i % 3] as Priority;
    samples[priority].push(await roundTrip(path, 1_000 + i, priority));
  }
  return { high: summarize(samples.high), normal: summarize(samples.normal), low: summarize(samples.low) };
}

interface QueueJump {
  /** How long the backlog took to drain from its first submit to its last final record. */
  backlogMs: number;
  probes: Record<"high" | "low", LatencySummary>;
}

/** Probes of one priority, submitted together right after a fresh backlog of low jobs. */
async function probeBehindBacklog(server: NatsServer, probe: "high" | "low"): Promise<{ backlogMs: number; probes: number[] }> {
  await using path = await open(server);
  for (let i = 0; i < 100; i++) await roundTrip(path, i, "low"); // warm-up
  const start = performance.now();
  const ids: string[] = [];
  // Submitted 64 at a time, so the backlog is queued within a fraction of its drain time.
  for (let i = 0; i < settings.backlog; i += 64) {
    const batch = Array.from({ length: Math.min(64, settings.backlog - i) }, (_, k) => path.submit(10_000 + i + k, { priority: "low" }));
    ids.push(...(await Promise.all(batch)));
  }
  const drained = Promise.all(ids.map((id) => path.done(id))).then(() => performance.now() - start);
  const probes = await Promise.all(Array.from({ length: settings.probes }, (_, i) => roundTrip(path, 100_000 + i, probe)));
  return { backlogMs: await drained, probes };
}

async function queueJump(server: NatsServer): Promise<QueueJump> {
  const high = await probeBehindBacklog(server, "high");
  const low = await probeBehindBacklog(server, "low");
  return { backlogMs: (high.backlogMs + low.backlogMs) / 2, probes: { high: summarize(high.probes), low: summarize(low.probes) } };
}

async function main(): Promise<void> {
  const server = await startNatsServer();
  try {
    log(`idle pickup: ${settings.idleJobs} jobs per priority, one at a time, worker concurrency ${settings.concurrency}`);
    const idle = await idlePickup(server);
    log(`jumping the queue: ${settings.probes} probes per priority behind ${settings.backlog} low jobs`);
    const jump = await queueJump(server);

    console.log("");
    console.log("Idle pickup: no-op job round trip on an idle worker, memory workspace (ms)");
    console.log(
      table([["priority", "p50", "p90", "p99"], ...PRIORITIES.map((p) => [p, ms(idle[p].p50), ms(idle[p].p90), ms(idle[p].p99)])]),
    );
    console.log("");
    console.log(
      `Jumping the queue: ${settings.probes} probes submitted together right after ${settings.backlog} low jobs were queued (the backlog took about ${ms(jump.backlogMs)} ms to drain), worker concurrency ${settings.concurrency}`,
    );
    console.log(
      table([
        ["probe priority", "p50", "p90", "max"],
        ...(["high", "low"] as const).map((p) => [p, ms(jump.probes[p].p50), ms(jump.probes[p].p90), ms(jump.probes[p].max)]),
      ]),
    );
  } finally {
    await server.stop();
  }
}

await main();
