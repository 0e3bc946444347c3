import { readdirSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, type NatsServer, startNatsServer } from "@boxcar/fabric";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";

/**
 * BENCH ONLY. Three real nats-servers in one JetStream cluster, each with its own store, client,
 * route and monitoring port, as `natsCluster` (@boxcar/testing) starts them; a launcher of its
 * own, for the servers' totals and for dropping every stream between runs. Resolves once
 * JetStream can place a stream with three replicas, so a Boxcar system opened on it gets
 * `replicas: 3` as on a production cluster.
 */
export interface ThreeServers {
  /** Client URLs, comma-separated, as `--nats` takes them. */
  readonly url: string;
  readonly servers: readonly { server: NatsServer; monitor: string }[];
  /** What the three did so far, summed: CPU from /proc, messages and bytes from /varz. */
  totals(): Promise<ServerTotals>;
  /** Deletes every stream (and so every bucket and store): the next system starts on an empty cluster. */
  dropAll(): Promise<void>;
  stop(): Promise<void>;
}

export interface ServerTotals {
  cpuMs: number;
  inMsgs: number;
  outMsgs: number;
  inBytes: number;
  outBytes: number;
  /** Snapshots, not counters: summed over the three. */
  connections: number;
  subscriptions: number;
  rssMiB: number;
}

export async function startThreeServers(): Promise<ThreeServers> {
  const root = await mkdtemp(join(tmpdir(), "boxcar-bench-cluster-"));
  const name = `bench${Math.random().toString(36).slice(2, 7)}`;
  const ports = [];
  for (let i = 0; i < 3; i++) ports.push({ client: await freePort(), route: await freePort(), monitor: await freePort() });
  const servers: { server: NatsServer; monitor: string }[] = [];
  let stopped = false;
  const stop = async () => {
    stopped = true;
    await Promise.all(servers.map((s) => s.server.stop()));
    await rm(root, { recursive: true, force: true });
  };
  try {
    for (const [i, p] of ports.entries()) {
      const server = await startNatsServer({
        port: p.client,
        storeDir: join(root, `n${i}`),
        serverName: `${name}-n${i}`,
        extraConfig: `http: "127.0.0.1:${p.monitor}"`,
        cluster: { name, port: p.route, routes: ports.filter((o) => o !== p).map((o) => `nats-route://127.0.0.1:${o.route}`) },
      });
      servers.push({ server, monitor: `http://127.0.0.1:${p.monitor}` });
    }
    await waitForThreeReplicas(servers.map((s) => s.server.url));
  } catch (err) {
    await stop();
    throw err;
  }
  // If the bench dies without stopping them, the servers (their own process group) must not outlive it.
  process.on("exit", () => {
    for (const { server } of stopped ? [] : servers) {
      try {
        process.kill(server.pid, "SIGKILL");
      } catch {
        // already stopped
      }
    }
  });
  const url = servers.map((s) => s.server.url).join(",");
  return {
    url,
    servers,
    async totals() {
      const t: ServerTotals = {
        cpuMs: 0,
        inMsgs: 0,
        outMsgs: 0,
        inBytes: 0,
        outBytes: 0,
        connections: 0,
        subscriptions: 0,
        rssMiB: 0,
      };
      for (const { server, monitor } of servers) {
        const varz = (await (await fetch(`${monitor}/varz`)).json()) as Record<string, number>;
        t.cpuMs += processCpuMs(server.pid);
        t.inMsgs += varz.in_msgs ?? 0;
        t.outMsgs += varz.out_msgs ?? 0;
        t.inBytes += varz.in_bytes ?? 0;
        t.outBytes += varz.out_bytes ?? 0;
        t.connections += varz.connections ?? 0;
        t.subscriptions += varz.subscriptions ?? 0;
        t.rssMiB += (varz.mem ?? 0) / 2 ** 20;
      }
      return t;
    },
    async dropAll() {
      const nc = await connect({ servers: url.split(","), name: "bench-cleanup" });
      try {
        const jsm = await jetstreamManager(nc);
        const streams: string[] = [];
        for await (const stream of jsm.streams.names()) streams.push(stream);
        for (const stream of streams) await jsm.streams.delete(stream);
      } finally {
        await nc.close();
      }
    },
    stop,
  };
}

/** Until a stream with three replicas can be placed: every server has joined JetStream's meta group. */
async function waitForThreeReplicas(urls: string[]): Promise<void> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const nc = await connect({ servers: urls, name: "bench-cluster-probe" }).catch(() => undefined);
    try {
      if (nc) {
        const jsm = await jetstreamManager(nc, { timeout: 2_000 });
        await jsm.streams.add({ name: "PROBE", subjects: ["bench.probe"], num_replicas: 3 });
        await jsm.streams.delete("PROBE");
        return;
      }
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`the cluster could not place three replicas within 60 s: ${(err as Error).message}`);
    } finally {
      await nc?.close();
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** Clock ticks per second of /proc's CPU times; 100 on every Linux this runs on. */
const TICKS = 100;

/**
 * CPU time a process used so far (user + system), in ms, from /proc/<pid>/stat; with
 * `children`, also that of the children it waited for (a worker's `true` processes).
 */
export function processCpuMs(pid: number, children = false): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  // The fields after the command name, which is in parentheses and may hold spaces.
  const f = stat
    .slice(stat.lastIndexOf(")") + 2)
    .split(" ")
    .map(Number);
  const ticks = (f[11] ?? 0) + (f[12] ?? 0) + (children ? (f[13] ?? 0) + (f[14] ?? 0) : 0);
  return (ticks * 1000) / TICKS;
}

/** Busy time of all CPUs together (everything but idle and iowait), in ms, from /proc/stat. */
export function machineBusyMs(): number {
  const [, ...fields] = (readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "").trim().split(/\s+/);
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = fields.map(Number);
  return ((user + nice + system + irq + softirq + steal) * 1000) / TICKS;
}

export function openFiles(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

export function rssMiB(pid: number): number {
  const kb = readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/)?.[1];
  return Number(kb ?? 0) / 1024;
}
