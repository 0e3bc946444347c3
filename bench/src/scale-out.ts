/**
 * Scale-out: saturation throughput of one dispatcher and 1, 2, 4, 8 worker processes on a real
 * three-server JetStream cluster (every stream and bucket with three replicas), for two agents:
 *
 * - `memory`: the no-op job with no process spawn (the worker's whole path, the agent "exits" at
 *   once, workspace in memory: `instant-sandbox.ts`), which is what Boxcar itself costs;
 * - `host`: the host sandbox running `true`: a workspace on disk and a process per job.
 *
 * Each worker is its own OS process (`worker-host.ts`, one `createWorker` each), the dispatcher
 * is the `boxcar dispatcher` command, and the submitter is this process: it keeps BENCH_IN_FLIGHT
 * jobs between submit and final record, and a run is timed from the first submit of BENCH_JOBS
 * to the last final record, after BENCH_WARMUP jobs on the same processes. Every run gets a
 * fresh system (own prefix, own processes), and the streams are deleted after it. The runs go
 * in BENCH_ROUNDS rounds, every other round in reverse order, so drift on the machine shows as
 * spread and favours no configuration.
 *
 * `pnpm bench:scale-out`. Environment: BENCH_ROUNDS (2), BENCH_JOBS (2000), BENCH_WARMUP (200),
 * BENCH_IN_FLIGHT (256), BENCH_CONCURRENCY (slots per worker, 16), BENCH_WORKERS (1,2,4,8),
 * BENCH_SANDBOXES (memory,host).
 */
import { cpus } from "node:os";
import { saturate } from "./load.js";
import { openSubmitter, startDispatcher, startWorkerHosts } from "./separate-roles.js";
import { envInt, gitCommit, table } from "./stats.js";
import { machineBusyMs, processCpuMs, startThreeServers, type ThreeServers } from "./three-servers.js";

const list = (name: string, fallback: string) => (process.env[name] || fallback).split(",").map((s) => s.trim());
const settings = {
  rounds: envInt("BENCH_ROUNDS", 2),
  jobs: envInt("BENCH_JOBS", 2000),
  warmup: envInt("BENCH_WARMUP", 200),
  inFlight: envInt("BENCH_IN_FLIGHT", 256),
  concurrency: envInt("BENCH_CONCURRENCY", 16),
  workers: list("BENCH_WORKERS", "1,2,4,8").map(Number),
  sandboxes: list("BENCH_SANDBOXES", "memory,host") as ("memory" | "host")[],
};
const log = (line: string) => process.stderr.write(`${line}\n`);

/** CPU used so far by each part, in ms, and the machine's busy time. */
interface Snapshot {
  at: number;
  servers: number;
  serverMsgs: number;
  dispatcher: number;
  workers: number;
  bench: number;
  machine: number;
}

interface Run {
  round: number;
  sandbox: "memory" | "host";
  workers: number;
  jobsPerSecond: number;
  /** CPU ms per job of each part; `machine`: cores kept busy on average (of cpus().length). */
  perJob: { servers: number; dispatcher: number; workers: number; bench: number };
  busyCores: number;
  /** Cores kept busy by processes not part of the run (another session's tests, say). */
  otherCores: number;
  serverMsgsPerJob: number;
}

let systems = 0;

async function measure(cluster: ThreeServers, round: number, sandbox: "memory" | "host", workers: number): Promise<Run> {
  const prefix = `scale${++systems}`;
  const dispatcher = await startDispatcher(cluster.url, prefix);
  try {
    const hosts = await startWorkerHosts({ url: cluster.url, prefix, workers, perProcess: 1, concurrency: settings.concurrency, sandbox });
    try {
      await using submitter = await openSubmitter(cluster.url, prefix);
      await saturate(submitter.run, settings.warmup, settings.inFlight);
      const snapshot = async (): Promise<Snapshot> => {
        // The CPU counters at one instant, then the servers' message counters (a round trip each).
        const own = process.cpuUsage();
        const cpu = {
          at: performance.now(),
          machine: machineBusyMs(),
          servers: cluster.servers.reduce((sum, s) => sum + processCpuMs(s.server.pid), 0),
          dispatcher: processCpuMs(dispatcher.pid),
          // With the children each waited for: the host sandbox's `true` processes.
          workers: hosts.pids.reduce((sum, pid) => sum + processCpuMs(pid, true), 0),
          bench: (own.user + own.system) / 1000,
        };
        const servers = await cluster.totals();
        return { ...cpu, serverMsgs: servers.inMsgs + servers.outMsgs };
      };
      const before = await snapshot();
      const sat = await saturate(submitter.run, settings.jobs, settings.inFlight, settings.warmup);
      const after = await snapshot();
      if (submitter.unsuccessful > 0) throw new Error(`${submitter.unsuccessful} jobs did not succeed; the run is not valid`);
      const per = (key: keyof Snapshot) => (after[key] - before[key]) / settings.jobs;
      return {
        round,
        sandbox,
        workers,
        jobsPerSecond: sat.jobsPerSecond,
        perJob: { servers: per("servers"), dispatcher: per("dispatcher"), workers: per("workers"), bench: per("bench") },
        busyCores: (after.machine - before.machine) / (after.at - before.at),
        otherCores:
          (after.machine -
            before.machine -
            (["servers", "dispatcher", "workers", "bench"] as const).reduce((sum, k) => sum + after[k] - before[k], 0)) /
          (after.at - before.at),
        serverMsgsPerJob: per("serverMsgs"),
      };
    } finally {
      await hosts.stop();
    }
  } finally {
    await dispatcher.stop();
    await cluster.dropAll();
  }
}

const configs = settings.sandboxes.flatMap((sandbox) => settings.workers.map((workers) => ({ sandbox, workers })));
const cluster = await startThreeServers();
const runs: Run[] = [];
try {
  log(`three servers up (${cpus().length} CPUs); ${new Date().toISOString()}, commit ${gitCommit()}`);
  for (let round = 1; round <= settings.rounds; round++) {
    for (const { sandbox, workers } of round % 2 === 1 ? configs : configs.toReversed()) {
      const run = await measure(cluster, round, sandbox, workers);
      runs.push(run);
      log(
        `round ${round}: ${sandbox}, ${workers} worker processes: ${run.jobsPerSecond.toFixed(0)} jobs/s, ${run.busyCores.toFixed(2)} cores busy (others ${run.otherCores.toFixed(2)})`,
      );
    }
  }
} finally {
  await cluster.stop();
}

const f1 = (n: number) => n.toFixed(1);
console.log(
  `\n${settings.jobs} jobs per run, ${settings.inFlight} in flight, ${settings.concurrency} slots per worker; CPU in ms per job, summed over the processes of each role\n`,
);
console.log(
  table([
    [
      "sandbox",
      "workers",
      "round",
      "jobs/s",
      "servers CPU",
      "dispatcher CPU",
      "workers CPU",
      "submitter CPU",
      "cores busy",
      "of them others",
      "server msgs/job",
    ],
    ...runs
      .toSorted((a, b) => a.sandbox.localeCompare(b.sandbox) || a.workers - b.workers || a.round - b.round)
      .map((r) => [
        r.sandbox,
        String(r.workers),
        String(r.round),
        r.jobsPerSecond.toFixed(0),
        f1(r.perJob.servers),
        f1(r.perJob.dispatcher),
        f1(r.perJob.workers),
        f1(r.perJob.bench),
        r.busyCores.toFixed(2),
        r.otherCores.toFixed(2),
        r.serverMsgsPerJob.toFixed(0),
      ]),
  ]),
);
console.log("\njobs/s, lowest-highest over the rounds\n");
console.log(
  table([
    ["sandbox", ...settings.workers.map((w) => `${w} workers`)],
    ...settings.sandboxes.map((sandbox) => [
      sandbox,
      ...settings.workers.map((w) => {
        const rates = runs.filter((r) => r.sandbox === sandbox && r.workers === w).map((r) => r.jobsPerSecond);
        return `${Math.min(...rates).toFixed(0)}-${Math.max(...rates).toFixed(0)}`;
      }),
    ]),
  ]),
);
