import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

/** CPU time used so far, in ms: this process (all its threads), the nats-server process, the whole machine. */
export interface CpuSnapshot {
  at: number;
  nodeUserMs: number;
  nodeSystemMs: number;
  /** Null where /proc is not available. */
  serverMs: number | null;
  /** Busy time of all CPUs together (everything but idle and iowait); null without /proc. */
  machineMs: number | null;
}

let ticksPerSecond: number | undefined;

function clockTicks(): number {
  if (ticksPerSecond === undefined) {
    try {
      ticksPerSecond = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
    } catch {
      ticksPerSecond = 100;
    }
  }
  return ticksPerSecond;
}

/** user + system time of a process from /proc/<pid>/stat (Linux), in ms. */
function processCpuMs(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command name, which is in parentheses and may hold spaces: state is field 3.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const utime = Number(fields[11]);
    const stime = Number(fields[12]);
    return ((utime + stime) * 1000) / clockTicks();
  } catch {
    return null;
  }
}

/** The machine's busy CPU time from the first line of /proc/stat, in ms. */
function machineCpuMs(): number | null {
  try {
    const [, ...fields] = (readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "").trim().split(/\s+/);
    const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = fields.map(Number);
    return ((user + nice + system + irq + softirq + steal) * 1000) / clockTicks();
  } catch {
    return null;
  }
}

export function cpuSnapshot(serverPid: number): CpuSnapshot {
  const usage = process.cpuUsage();
  return {
    at: performance.now(),
    nodeUserMs: usage.user / 1000,
    nodeSystemMs: usage.system / 1000,
    serverMs: processCpuMs(serverPid),
    machineMs: machineCpuMs(),
  };
}

/** CPU ms per job between two snapshots. */
export interface CpuPerJob {
  nodeUserMs: number;
  nodeSystemMs: number;
  serverMs: number | null;
  /**
   * CPUs kept busy on average by everything else on the machine (other processes, the kernel's
   * own threads) while the run went on: a check that the figures were not taken on a busy host.
   */
  otherCores: number | null;
}

export function cpuPerJob(before: CpuSnapshot, after: CpuSnapshot, jobs: number): CpuPerJob {
  const delta = (f: (s: CpuSnapshot) => number | null) => {
    const a = f(after);
    const b = f(before);
    return a === null || b === null ? null : a - b;
  };
  const node = after.nodeUserMs - before.nodeUserMs + (after.nodeSystemMs - before.nodeSystemMs);
  const server = delta((s) => s.serverMs);
  const machine = delta((s) => s.machineMs);
  return {
    nodeUserMs: (after.nodeUserMs - before.nodeUserMs) / jobs,
    nodeSystemMs: (after.nodeSystemMs - before.nodeSystemMs) / jobs,
    serverMs: server === null ? null : server / jobs,
    otherCores: machine === null || server === null ? null : Math.max(0, machine - node - server) / (after.at - before.at),
  };
}
