/**
 * Flow-control benchmark: what a concurrency limit costs a job, against one nats-server started
 * here, on the memory-workspace path (no process, no files: Boxcar's own overhead only). Run it
 * with `pnpm bench:limits`; docs/benchmarks.md#concurrency-limits has the figures.
 *
 * Five systems side by side, each with a prefix of its own: the no-op agent with no limit, with
 * a concurrency limit it never reaches (`limit: 1000`: every job takes a free place, the fast
 * path), with a limit of 1 per key over 64 keys, one job in flight per key (every job takes a
 * free place of its own key), with a pool limit it never reaches (the system policy's), and with
 * both the key's and the pool's (two places a job). Rounds interleave the systems (A, B, C, A,
 * B, C, ...), so the machine's noise falls on all alike. Each round measures:
 *
 * - latency: BENCH_N jobs one at a time, submit to final record (p50, p90);
 * - throughput: BENCH_JOBS jobs with 64 in flight (jobs per second);
 * - messages: what the dispatcher's connection sent and received during the throughput run, per
 *   job (requests and replies of the KV and stream APIs, events, work items).
 *
 * Environment: BENCH_N (default 200), BENCH_JOBS (default 2000), BENCH_ROUNDS (default 3).
 */
import { tmpdir } from "node:os";
import { type NatsServer, startNatsServer } from "@boxcar/fabric";
import { type BoxcarPath, openBoxcarPath } from "./boxcar-path.js";
import { createInstantSandboxProvider } from "./instant-sandbox.js";
import { envInt, gitCommit, ms, summarize, table } from "./stats.js";

const settings = { n: envInt("BENCH_N", 200), jobs: envInt("BENCH_JOBS", 2000), rounds: envInt("BENCH_ROUNDS", 3) };
const IN_FLIGHT = 64;
const log = (line: string) => process.stderr.write(`${line}\n`);

/** A pool limit no run reaches: every job takes a free place in its pool too. */
const POOL_LIMIT = { pools: { default: { concurrency: 1_000 } } };

const SYSTEMS = [
  { name: "no limit", limits: {}, keyed: false },
  { name: "concurrency, never full", limits: { concurrency: { limit: 1_000 } }, keyed: false },
  { name: "concurrency 1 per key, 64 keys", limits: { concurrency: { limit: 1, key: "input.k" } }, keyed: true },
  { name: "pool limit, never full", limits: {}, policy: POOL_LIMIT, keyed: false },
  { name: "1 per key, 64 keys, and a pool limit", limits: { concurrency: { limit: 1, key: "input.k" } }, policy: POOL_LIMIT, keyed: true },
] as const;

interface Samples {
  latency: number[];
  perSecond: number[];
  messages: number[];
}

async function open(server: NatsServer, i: number): Promise<BoxcarPath> {
  const system = SYSTEMS[i] as (typeof SYSTEMS)[number];
  return openBoxcarPath({
    url: server.url,
    prefix: `benchlimits${i}`,
    providers: [createInstantSandboxProvider("memory", tmpdir())],
    concurrency: IN_FLIGHT,
    limits: system.limits,
    ...("policy" in system ? { policy: system.policy } : {}),
  });
}

/** The input of a job of lane `lane`: on the keyed system, the lane's own key, so 64 in flight never wait. */
const input = (keyed: boolean, lane: number) => (keyed ? { input: { k: `key${lane}` } } : {});

async function round(path: BoxcarPath, keyed: boolean, into: Samples, base: number): Promise<void> {
  for (let i = 0; i < settings.n; i++) {
    const start = performance.now();
    await path.done(await path.submit(base + i, input(keyed, i)));
    into.latency.push(performance.now() - start);
  }
  const stats = path.connections.dispatcher.stats();
  const before = stats.inMsgs + stats.outMsgs;
  const start = performance.now();
  let next = 0;
  const lane = async (l: number) => {
    while (next < settings.jobs) {
      const i = next++;
      await path.done(await path.submit(base + settings.n + i, input(keyed, l)));
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, (_, l) => lane(l)));
  into.perSecond.push((settings.jobs / (performance.now() - start)) * 1000);
  const after = path.connections.dispatcher.stats();
  into.messages.push((after.inMsgs + after.outMsgs - before) / settings.jobs);
}

async function main(): Promise<void> {
  const server = await startNatsServer();
  const paths: BoxcarPath[] = [];
  try {
    for (let i = 0; i < SYSTEMS.length; i++) paths.push(await open(server, i));
    const samples: Samples[] = SYSTEMS.map(() => ({ latency: [], perSecond: [], messages: [] }));
    for (const [i, path] of paths.entries()) {
      for (let w = 0; w < 100; w++) await path.done(await path.submit(w, input(SYSTEMS[i]?.keyed ?? false, w))); // warm-up
    }
    for (let r = 0; r < settings.rounds; r++) {
      for (const [i, path] of paths.entries()) {
        log(`round ${r + 1}/${settings.rounds}: ${SYSTEMS[i]?.name}`);
        await round(path, SYSTEMS[i]?.keyed ?? false, samples[i] as Samples, 1_000_000 * (r + 1));
      }
    }
    for (const path of paths) if (path.unsuccessful > 0) throw new Error(`${path.unsuccessful} jobs did not succeed: the run is not valid`);
    const median = (xs: number[]) => summarize(xs).p50;
    console.log("");
    console.log(
      `Concurrency limits, memory workspace, commit ${gitCommit()}: ${settings.rounds} interleaved rounds, each ${settings.n} jobs one at a time, then ${settings.jobs} with ${IN_FLIGHT} in flight`,
    );
    console.log(
      table([
        ["system", "p50 (ms)", "p90 (ms)", "jobs/s (median of rounds)", "dispatcher messages per job"],
        ...SYSTEMS.map((s, i) => {
          const got = samples[i] as Samples;
          const latency = summarize(got.latency);
          return [s.name, ms(latency.p50), ms(latency.p90), median(got.perSecond).toFixed(0), median(got.messages).toFixed(1)];
        }),
      ]),
    );
  } finally {
    for (const path of paths) await path[Symbol.asyncDispose]();
    await server.stop();
  }
}

await main();
