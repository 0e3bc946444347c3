import { type ChildProcess, fork, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { connectNats, createClient, resolveConnection } from "@boxcar/client";
import { freePort, openTopology } from "@boxcar/fabric";
import { isTerminal, type JobRecord } from "@boxcar/protocol";
import { KvWatchInclude } from "@nats-io/kv";
import { Completions } from "./load.js";
// Types only: worker-host.ts is the child process's script, and importing its code would run it here.
import type { HostRequest, HostStats } from "./worker-host.js";

/**
 * BENCH ONLY. Boxcar's roles as separate OS processes on one NATS system: a dispatcher (the real
 * `boxcar dispatcher` command), workers (`worker-host.ts`: one or many `createWorker` per
 * process), and a submitter in the bench's own process.
 */

const CLI = fileURLToPath(new URL("../../packages/cli/dist/bin/boxcar.js", import.meta.url));
const WORKER_HOST = fileURLToPath(new URL("./worker-host.js", import.meta.url));
export const AGENT = "noop";

/** Every child still running, killed outright if the bench exits without stopping it. */
const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const child of children) child.kill("SIGKILL");
});

function track(child: ChildProcess): ChildProcess {
  children.add(child);
  child.once("exit", () => children.delete(child));
  return child;
}

/** Stops a child: `ask` it to, then SIGKILL after 15 s. */
async function stopChild(child: ChildProcess, ask: () => void): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  ask();
  const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
  await exited;
  clearTimeout(timer);
}

export interface RoleProcess {
  readonly pid: number;
  stop(): Promise<void>;
}

/** `boxcar dispatcher` on the system `prefix`; resolves once its /readyz says ready. */
export async function startDispatcher(url: string, prefix: string): Promise<RoleProcess> {
  const health = `127.0.0.1:${await freePort()}`;
  const child = track(
    spawn(process.execPath, [CLI, "dispatcher", "--nats", url, "--prefix", prefix, "--health", health], {
      stdio: ["ignore", "ignore", "inherit"],
      env: { ...process.env, BOXCAR_LOG_LEVEL: "warn" },
    }),
  );
  const stop = () => stopChild(child, () => child.kill("SIGTERM"));
  const deadline = Date.now() + 60_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`the dispatcher exited with ${child.exitCode} before it was ready`);
    const ready = await fetch(`http://${health}/readyz`).then(
      (r) => r.ok,
      () => false,
    );
    if (ready) return { pid: child.pid as number, stop };
    if (Date.now() > deadline) {
      await stop();
      throw new Error("the dispatcher was not ready within 60 s");
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

export interface WorkerHosts {
  readonly pids: readonly number[];
  /** The longest time a process took to start its workers, in ms. */
  readonly startMs: number;
  /** Counters summed over every process. */
  stats(): Promise<HostStats>;
  stop(): Promise<void>;
}

/**
 * `workers` workers in processes of at most `perProcess` each; resolves once every worker pulls.
 * `sandbox`: `memory` (no process, workspace in memory) or `host` (the host sandbox).
 */
export async function startWorkerHosts(opts: {
  url: string;
  prefix: string;
  workers: number;
  perProcess: number;
  concurrency: number;
  sandbox: "memory" | "host";
}): Promise<WorkerHosts> {
  const hosts: ChildProcess[] = [];
  for (let started = 0; started < opts.workers; started += opts.perProcess) {
    const count = Math.min(opts.perProcess, opts.workers - started);
    const args = [opts.url, opts.prefix, String(count), String(opts.concurrency), opts.sandbox, `${opts.prefix}-p${hosts.length}`];
    hosts.push(track(fork(WORKER_HOST, args, { stdio: ["ignore", "inherit", "inherit", "ipc"] })));
  }
  const send = (host: ChildProcess, request: HostRequest) => host.send(request);
  const stop = () => Promise.all(hosts.map((h) => stopChild(h, () => send(h, { type: "stop" })))).then(() => {});
  let startMs = 0;
  try {
    await Promise.all(
      hosts.map(
        (host) =>
          new Promise<void>((resolve, reject) => {
            host.once("message", (m: { type: string; startMs: number }) => {
              startMs = Math.max(startMs, m.startMs);
              resolve();
            });
            host.once("exit", (code) => reject(new Error(`a worker process exited with ${code} before its workers were ready`)));
          }),
      ),
    );
  } catch (err) {
    await stop();
    throw err;
  }
  const statsOf = (host: ChildProcess) =>
    new Promise<HostStats>((resolve) => {
      host.once("message", (m: { type: string; stats: HostStats }) => resolve(m.stats));
      send(host, { type: "stats" });
    });
  return {
    pids: hosts.map((h) => h.pid as number),
    startMs,
    async stats() {
      const all = await Promise.all(hosts.map(statsOf));
      const sum: HostStats = noHostStats();
      for (const s of all) {
        for (const key of ["workers", "inMsgs", "outMsgs", "inBytes", "outBytes", "pulls", "bells", "bellBytes", "warnings"] as const)
          sum[key] += s[key];
        if (sum.warningSamples.length < 8) sum.warningSamples.push(...s.warningSamples);
      }
      return sum;
    },
    stop,
  };
}

export interface Submitter extends AsyncDisposable {
  /** Submits no-op job `i` over `jobs.submit`; resolves once the watcher sees its final record. */
  run(i: number): Promise<void>;
  /** Jobs that ended in a state other than `succeeded`: a run with any is not valid. */
  readonly unsuccessful: number;
}

/**
 * A client in this process, connected as the CLI connects: it applies the no-op agent (`true`,
 * on the host, trusted) and submits jobs over request/reply; one watcher on the jobs bucket
 * tells when each is final. Whether `true` is run depends on the workers' sandbox.
 */
export async function openSubmitter(url: string, prefix: string): Promise<Submitter> {
  const connection = resolveConnection({ flags: { nats: url }, env: {} });
  const nc = await connectNats(connection, `${prefix}-submitter`);
  const topology = await openTopology(nc, { prefix });
  const client = createClient(topology, { identity: connection.identity });
  await client.applyAgent({ name: AGENT, command: ["true"], runtime: { sandbox: "host" }, trusted: true });
  const completions = new Completions();
  let unsuccessful = 0;
  const watch = await topology.jobs.watch({ include: KvWatchInclude.UpdatesOnly });
  const watching = (async () => {
    for await (const entry of watch) {
      if (entry.operation !== "PUT") continue;
      const record = entry.json<JobRecord>();
      if (!isTerminal(record.state)) continue;
      if (record.state !== "succeeded") unsuccessful += 1;
      completions.complete(entry.key);
    }
  })();
  return {
    run: async (i) => completions.wait((await client.submit({ agent: AGENT, input: i })).job.id),
    get unsuccessful() {
      return unsuccessful;
    },
    async [Symbol.asyncDispose]() {
      watch.stop();
      await watching;
      await nc.drain();
    },
  };
}

/** Stats of no worker at all: where sums start. */
export function noHostStats(): HostStats {
  return { workers: 0, inMsgs: 0, outMsgs: 0, inBytes: 0, outBytes: 0, pulls: 0, bells: 0, bellBytes: 0, warnings: 0, warningSamples: [] };
}
