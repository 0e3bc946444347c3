/**
 * What idle workers cost, on a real three-server JetStream cluster (streams and buckets with
 * three replicas): for each count in BENCH_IDLE_WORKERS, that many real workers (`createWorker`,
 * one NATS connection each, with presence, heartbeats and pull loops), BENCH_PER_PROCESS to an
 * OS process (`worker-host.ts`), and one `boxcar dispatcher`.
 *
 * 1. Idle: no jobs for BENCH_WINDOW_S seconds (after BENCH_SETTLE_S past the start): the three
 *    servers' CPU (/proc) and messages and bytes in and out (/varz deltas, summed: a message
 *    that crosses a route counts on both servers), and on the workers' side their processes'
 *    CPU, memory and open files, and what their connections sent and received.
 * 2. Jobs flowing: BENCH_RATE no-op jobs a second (memory workspace, no process) submitted
 *    through the dispatcher for BENCH_FLOW_S seconds while the same workers wait: what each job
 *    costs on top of the idle traffic, and how many copies of it ("bells": heard on plain subscriptions to
 *    the work subjects, as workers before waiting pulls did; none now) and
 *    pull requests it makes the workers receive and send.
 *
 * `pnpm bench:idle`. Environment: BENCH_IDLE_WORKERS (0,10,100,1000; 0 is the cluster with a
 * dispatcher and nothing else), BENCH_PER_PROCESS (100), BENCH_CONCURRENCY (slots per worker,
 * 4, as `boxcar worker`), BENCH_SETTLE_S (10), BENCH_WINDOW_S (30), BENCH_RATE (20),
 * BENCH_FLOW_S (15). Raise `ulimit -n` for thousands of workers.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { noHostStats, openSubmitter, startDispatcher, startWorkerHosts, type WorkerHosts } from "./separate-roles.js";
import { envInt, gitCommit, ms, summarize, table } from "./stats.js";
import {
  machineBusyMs,
  openFiles,
  processCpuMs,
  rssMiB,
  type ServerTotals,
  startThreeServers,
  type ThreeServers,
} from "./three-servers.js";
import type { HostStats } from "./worker-host.js";

const settings = {
  levels: (process.env.BENCH_IDLE_WORKERS || "0,10,100,1000").split(",").map(Number),
  perProcess: envInt("BENCH_PER_PROCESS", 100),
  concurrency: envInt("BENCH_CONCURRENCY", 4),
  settleS: envInt("BENCH_SETTLE_S", 10),
  windowS: envInt("BENCH_WINDOW_S", 30),
  rate: envInt("BENCH_RATE", 20),
  flowS: envInt("BENCH_FLOW_S", 15),
};
const log = (line: string) => process.stderr.write(`${line}\n`);

const NO_HOSTS: HostStats = noHostStats();

interface Snapshot {
  at: number;
  servers: ServerTotals;
  hosts: HostStats;
  /** CPU ms of the worker processes together, and of the dispatcher. */
  workersCpu: number;
  dispatcherCpu: number;
  /** This process (submitter), and the whole machine's busy time: the rest is someone else's. */
  benchCpu: number;
  machine: number;
}

/** Counters of `b` minus `a`, per second or per job: the caller divides. */
function delta(a: Snapshot, b: Snapshot) {
  return {
    seconds: (b.at - a.at) / 1000,
    serverCpu: b.servers.cpuMs - a.servers.cpuMs,
    serverIn: b.servers.inMsgs - a.servers.inMsgs,
    serverOut: b.servers.outMsgs - a.servers.outMsgs,
    serverOutBytes: b.servers.outBytes - a.servers.outBytes,
    workerIn: b.hosts.inMsgs - a.hosts.inMsgs,
    workerOut: b.hosts.outMsgs - a.hosts.outMsgs,
    workerInBytes: b.hosts.inBytes - a.hosts.inBytes,
    pulls: b.hosts.pulls - a.hosts.pulls,
    bells: b.hosts.bells - a.hosts.bells,
    bellBytes: b.hosts.bellBytes - a.hosts.bellBytes,
    workersCpu: b.workersCpu - a.workersCpu,
    dispatcherCpu: b.dispatcherCpu - a.dispatcherCpu,
    machine: b.machine - a.machine,
    /** CPU of processes not part of this bench (and the kernel's own threads). */
    others:
      b.machine -
      a.machine -
      (b.servers.cpuMs - a.servers.cpuMs) -
      (b.workersCpu - a.workersCpu) -
      (b.dispatcherCpu - a.dispatcherCpu) -
      (b.benchCpu - a.benchCpu),
  };
}
type Delta = ReturnType<typeof delta>;

interface Level {
  workers: number;
  processes: number;
  startS: number;
  idle: Delta;
  /** Snapshots at the end of the idle window. */
  servers: ServerTotals;
  workersRssMiB: number;
  fdsPerProcess: number;
  warnings: number;
  warningSamples: string[];
  flow?: { jobs: number; latency: ReturnType<typeof summarize>; during: Delta; failed: number };
}

const fmt = (n: number, digits = 0) => n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
/** Per second of a delta, or per job: `x` over `d.seconds`. */
const rate = (x: number, d: Delta) => x / d.seconds;
const pct = (cpuMs: number, d: Delta) => `${fmt(rate(cpuMs, d) / 10, 1)}%`;

async function measure(cluster: ThreeServers, workers: number): Promise<Level> {
  const prefix = `idle${workers}`;
  const dispatcher = await startDispatcher(cluster.url, prefix);
  let hosts: WorkerHosts | undefined;
  try {
    const starting = performance.now();
    if (workers > 0) {
      hosts = await startWorkerHosts({
        url: cluster.url,
        prefix,
        workers,
        perProcess: settings.perProcess,
        concurrency: settings.concurrency,
        sandbox: "memory",
      });
    }
    const startS = (performance.now() - starting) / 1000;
    log(`${workers} workers: started in ${startS.toFixed(1)} s`);
    await using submitter = await openSubmitter(cluster.url, prefix);
    if (workers > 0) for (let i = 0; i < 5; i++) await submitter.run(i); // every role has run a job once
    const pids = hosts?.pids ?? [];
    const snapshot = async (): Promise<Snapshot> => {
      // Every CPU counter at one instant; then the message counters, which take round trips
      // (seconds, on an overloaded machine) and so lag a little behind.
      const cpu = {
        at: performance.now(),
        machine: machineBusyMs(),
        serverCpu: cluster.servers.reduce((sum, s) => sum + processCpuMs(s.server.pid), 0),
        workersCpu: pids.reduce((sum, pid) => sum + processCpuMs(pid), 0),
        dispatcherCpu: processCpuMs(dispatcher.pid),
        benchCpu: (process.cpuUsage().user + process.cpuUsage().system) / 1000,
      };
      const servers = { ...(await cluster.totals()), cpuMs: cpu.serverCpu };
      return { ...cpu, servers, hosts: (await hosts?.stats()) ?? NO_HOSTS };
    };

    await sleep(settings.settleS * 1000);
    const before = await snapshot();
    await sleep(settings.windowS * 1000);
    const after = await snapshot();
    const level: Level = {
      workers,
      processes: pids.length,
      startS,
      idle: delta(before, after),
      servers: after.servers,
      workersRssMiB: pids.reduce((sum, pid) => sum + rssMiB(pid), 0),
      fdsPerProcess: pids.length ? Math.max(...pids.map(openFiles)) : 0,
      warnings: after.hosts.warnings,
      warningSamples: after.hosts.warningSamples,
    };
    const idle = level.idle;
    log(
      `${workers} workers idle: servers ${pct(idle.serverCpu, idle)} CPU, ${fmt(rate(idle.serverIn + idle.serverOut, idle))} msgs/s in+out; ` +
        `worker processes ${pct(idle.workersCpu, idle)} CPU, ${fmt(level.workersRssMiB)} MiB; machine ${pct(idle.machine, idle)} (others ${pct(idle.others, idle)})`,
    );
    if (workers === 0) return level;

    // Jobs at a steady rate, each submitted on time whatever the ones before are doing (open loop).
    const jobs = settings.rate * settings.flowS;
    const latencies: number[] = [];
    const failedBefore = submitter.unsuccessful;
    let unanswered = 0;
    const flowStart = await snapshot();
    const pending: Promise<void>[] = [];
    for (let i = 0; i < jobs; i++) {
      const due = flowStart.at + (i * 1000) / settings.rate;
      if (due > performance.now()) await sleep(due - performance.now());
      const submitted = performance.now();
      // A submit the dispatcher does not answer within the client's 10 s counts as failed, not as a crash.
      pending.push(
        submitter.run(100 + i).then(
          () => void latencies.push(performance.now() - submitted),
          () => void unanswered++,
        ),
      );
    }
    await Promise.all(pending);
    const flowEnd = await snapshot();
    level.flow = {
      jobs,
      latency: summarize(latencies),
      during: delta(flowStart, flowEnd),
      failed: submitter.unsuccessful - failedBefore + unanswered,
    };
    level.warnings = flowEnd.hosts.warnings;
    level.warningSamples = flowEnd.hosts.warningSamples;
    log(`${workers} workers, ${settings.rate} jobs/s: p50 ${ms(level.flow.latency.p50)} ms`);
    return level;
  } finally {
    await hosts?.stop();
    await dispatcher.stop();
    await cluster.dropAll();
  }
}

const cluster = await startThreeServers();
const levels: Level[] = [];
try {
  log(`three servers up; ${new Date().toISOString()}, commit ${gitCommit()}`);
  for (const workers of settings.levels) levels.push(await measure(cluster, workers));
} finally {
  await cluster.stop();
}

console.log(`\nIdle, ${settings.windowS} s window; the three servers summed; CPU in % of one core\n`);
console.log(
  table([
    [
      "workers",
      "processes",
      "start (s)",
      "servers CPU",
      "msgs in/s",
      "msgs out/s",
      "KiB out/s",
      "conns",
      "subs",
      "servers RSS MiB",
      "machine busy",
      "others",
    ],
    ...levels.map((l) => [
      String(l.workers),
      String(l.processes),
      fmt(l.startS, 1),
      pct(l.idle.serverCpu, l.idle),
      fmt(rate(l.idle.serverIn, l.idle)),
      fmt(rate(l.idle.serverOut, l.idle)),
      fmt(rate(l.idle.serverOutBytes, l.idle) / 1024, 1),
      String(l.servers.connections),
      String(l.servers.subscriptions),
      fmt(l.servers.rssMiB),
      pct(l.idle.machine, l.idle),
      pct(l.idle.others, l.idle),
    ]),
  ]),
);
console.log("\nThe same window, the workers' side (per worker: averaged over all of them)\n");
console.log(
  table([
    [
      "workers",
      "worker procs CPU",
      "dispatcher CPU",
      "RSS MiB (all)",
      "RSS MiB/worker",
      "fds/process",
      "pulls/s/worker",
      "out/s/worker",
      "in/s/worker",
      "warnings",
    ],
    ...levels
      .filter((l) => l.workers > 0)
      .map((l) => [
        String(l.workers),
        pct(l.idle.workersCpu, l.idle),
        pct(l.idle.dispatcherCpu, l.idle),
        fmt(l.workersRssMiB),
        fmt(l.workersRssMiB / l.workers, 2),
        String(l.fdsPerProcess),
        fmt(rate(l.idle.pulls, l.idle) / l.workers, 2),
        fmt(rate(l.idle.workerOut, l.idle) / l.workers, 2),
        fmt(rate(l.idle.workerIn, l.idle) / l.workers, 2),
        String(l.warnings),
      ]),
  ]),
);

console.log(`\n${settings.rate} no-op jobs/s for ${settings.flowS} s; "per job": on top of the idle traffic of the same workers\n`);
console.log(
  table([
    [
      "workers",
      "p50 ms",
      "p99 ms",
      "max ms",
      "servers CPU",
      "worker procs CPU",
      "machine busy",
      "others",
      "srv msgs/job",
      "srv KiB out/job",
      "bells/job",
      "pulls/job",
      "msgs to workers/job",
      "KiB to workers/job",
    ],
    ...levels.flatMap((l) => {
      if (!l.flow) return [];
      const d = l.flow.during;
      // What the flow added: the window's count less what the idle rate alone would have made.
      const extra = (x: number, idle: number) => (x - rate(idle, l.idle) * d.seconds) / (l.flow?.jobs ?? 1);
      return [
        [
          String(l.workers),
          ms(l.flow.latency.p50),
          ms(l.flow.latency.p99),
          ms(l.flow.latency.max),
          pct(d.serverCpu, d),
          pct(d.workersCpu, d),
          pct(d.machine, d),
          pct(d.others, d),
          fmt(extra(d.serverIn + d.serverOut, l.idle.serverIn + l.idle.serverOut)),
          fmt(extra(d.serverOutBytes, l.idle.serverOutBytes) / 1024, 1),
          fmt(extra(d.bells, l.idle.bells), 1),
          fmt(extra(d.pulls, l.idle.pulls), 1),
          fmt(extra(d.workerIn, l.idle.workerIn)),
          fmt(extra(d.workerInBytes, l.idle.workerInBytes) / 1024, 1),
        ],
      ];
    }),
  ]),
);
for (const l of levels) {
  if (l.flow?.failed) console.log(`${l.workers} workers: ${l.flow.failed} jobs did not succeed`);
  if (l.warnings) console.log(`${l.workers} workers: ${l.warnings} warnings, among them:\n  ${l.warningSamples.join("\n  ")}`);
}
