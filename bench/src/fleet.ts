/**
 * Fleet benchmark, on a real three-server JetStream cluster started here (`pnpm bench:fleet`;
 * docs/benchmarks.md has the figures and what they mean):
 *
 * 1. Idle workers: what N workers that have nothing to do cost the NATS servers (CPU, messages
 *    and bytes per second, summed over the three), for N in BENCH_IDLE (default 10,100,1000),
 *    spread over processes of at most BENCH_PER_PROCESS (default 100) workers each, every
 *    worker on its own connection with its presence, heartbeat and pull loops. Then the same
 *    fleet while jobs trickle in (BENCH_TRICKLE jobs/s for 10 s, default 10): what one job
 *    costs the servers in messages and bytes delivered, with N workers listening for work.
 * 2. Scale-out: saturation throughput (BENCH_JOBS jobs, default 2000, 64 in flight) with 1, 2, 4
 *    and 8 worker processes of one worker each (concurrency 4), for the no-op path (no process,
 *    workspace in memory) and the host sandbox running `true`; one dispatcher and the client
 *    in this process.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { freePort, type NatsServer, openTopology, startNatsServer } from "@boxcar/client";
import { connect } from "@nats-io/transport-node";
import { openBoxcarPath } from "./boxcar-path.js";
import { envInt, table } from "./stats.js";

const settings = {
  idle: (process.env.BENCH_IDLE ?? "10,100,1000").split(",").map(Number),
  perProcess: envInt("BENCH_PER_PROCESS", 100),
  window: envInt("BENCH_WINDOW_S", 20),
  trickle: envInt("BENCH_TRICKLE", 10),
  jobs: envInt("BENCH_JOBS", 2000),
  scale: (process.env.BENCH_SCALE ?? "1,2,4,8").split(",").map(Number),
};
const log = (line: string) => process.stderr.write(`${line}\n`);
const CHILD = fileURLToPath(new URL("./fleet-workers.js", import.meta.url));
const CLOCK_TICKS = 100;

interface Member {
  server: NatsServer;
  monitor: number;
}

/** Three servers in one JetStream cluster, with monitoring; resolves once JetStream answers. */
async function startCluster(root: string): Promise<Member[]> {
  const ports = await Promise.all(
    Array.from({ length: 3 }, async () => ({ client: await freePort(), route: await freePort(), monitor: await freePort() })),
  );
  const members = await Promise.all(
    ports.map(async (p, i) => ({
      monitor: p.monitor,
      server: await startNatsServer({
        port: p.client,
        storeDir: join(root, `n${i}`),
        serverName: `fleet-n${i}`,
        extraConfig: `http: "127.0.0.1:${p.monitor}"`,
        cluster: { name: "fleet", port: p.route, routes: ports.filter((o) => o !== p).map((o) => `nats-route://127.0.0.1:${o.route}`) },
      }),
    })),
  );
  const nc = await connect({ servers: members.map((m) => m.server.url) });
  for (let tries = 0; ; tries++) {
    try {
      await openTopology(nc, { prefix: "fleetprobe" });
      break;
    } catch (err) {
      if (tries > 120) throw err;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
  await nc.close();
  return members;
}

/** What the servers did so far: CPU seconds and messages and bytes in and out, summed. */
interface ServerTotals {
  cpu: number;
  inMsgs: number;
  outMsgs: number;
  inBytes: number;
  outBytes: number;
}

function cpuSeconds(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? [];
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS;
}

function rssMiB(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/);
  return Number(line?.[1] ?? 0) / 1024;
}

async function serverTotals(members: Member[]): Promise<ServerTotals> {
  const totals: ServerTotals = { cpu: 0, inMsgs: 0, outMsgs: 0, inBytes: 0, outBytes: 0 };
  for (const m of members) {
    const varz = (await (await fetch(`http://127.0.0.1:${m.monitor}/varz`)).json()) as Record<string, number>;
    totals.cpu += cpuSeconds(m.server.pid);
    totals.inMsgs += varz.in_msgs ?? 0;
    totals.outMsgs += varz.out_msgs ?? 0;
    totals.inBytes += varz.in_bytes ?? 0;
    totals.outBytes += varz.out_bytes ?? 0;
  }
  return totals;
}

const minus = (a: ServerTotals, b: ServerTotals): ServerTotals => ({
  cpu: a.cpu - b.cpu,
  inMsgs: a.inMsgs - b.inMsgs,
  outMsgs: a.outMsgs - b.outMsgs,
  inBytes: a.inBytes - b.inBytes,
  outBytes: a.outBytes - b.outBytes,
});

/** Worker processes of `fleet-workers.ts`; resolves once every worker in them pulls. */
async function startWorkers(members: Member[], prefix: string, total: number, perProcess: number, concurrency: number, workspace: string) {
  const urls = members.map((m) => m.server.url).join(",");
  const children: ChildProcess[] = [];
  for (let started = 0, p = 0; started < total; p++) {
    const count = Math.min(perProcess, total - started);
    started += count;
    const child = spawn(process.execPath, [CHILD, urls, prefix, String(count), String(concurrency), workspace, `${prefix}-p${p}`], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    children.push(child);
  }
  await Promise.all(
    children.map(
      (c) =>
        new Promise<void>((resolve, reject) => {
          c.stdout?.on("data", (d: Buffer) => d.toString().includes("ready") && resolve());
          c.once("exit", (code) => reject(new Error(`a worker process exited with ${code} before it was ready`)));
        }),
    ),
  );
  return {
    pids: children.map((c) => c.pid as number),
    async stop() {
      await Promise.all(
        children.map(
          (c) =>
            new Promise<void>((resolve) => {
              if (c.exitCode !== null) return resolve();
              c.once("exit", () => resolve());
              c.kill("SIGTERM");
            }),
        ),
      );
    },
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const fmt = (n: number, digits = 0) => n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });

async function idleCosts(members: Member[]): Promise<string[][]> {
  const rows: string[][] = [];
  for (const n of settings.idle) {
    const prefix = `fleetidle${n}`;
    // The dispatcher and client first, so the stream and consumers exist before the workers.
    await using path = await openBoxcarPath({
      url: members[0]?.server.url as string,
      prefix,
      providers: [],
      concurrency: 1,
      noWorker: true,
    });
    const started = performance.now();
    const fleet = await startWorkers(members, prefix, n, settings.perProcess, 1, "memory");
    const startSeconds = (performance.now() - started) / 1000;
    try {
      await sleep(5_000); // past the start-up burst
      const before = await serverTotals(members);
      const fleetCpuBefore = fleet.pids.reduce((sum, pid) => sum + cpuSeconds(pid), 0);
      await sleep(settings.window * 1000);
      const idle = minus(await serverTotals(members), before);
      const fleetCpu = fleet.pids.reduce((sum, pid) => sum + cpuSeconds(pid), 0) - fleetCpuBefore;
      const fleetRss = fleet.pids.reduce((sum, pid) => sum + rssMiB(pid), 0);
      // Jobs trickling in: each is announced to every idle worker of the pool.
      const flowing = await serverTotals(members);
      const ids: Promise<void>[] = [];
      const jobs = settings.trickle * 10;
      for (let i = 0; i < jobs; i++) {
        ids.push(path.run(i));
        await sleep(1000 / settings.trickle);
      }
      await Promise.all(ids);
      const flow = minus(await serverTotals(members), flowing);
      const perJobMsgs = (flow.outMsgs - (idle.outMsgs / settings.window) * 10) / jobs;
      const perJobBytes = (flow.outBytes - (idle.outBytes / settings.window) * 10) / jobs;
      const s = settings.window;
      rows.push([
        String(n),
        fmt(startSeconds, 1),
        `${fmt((idle.cpu / s) * 100, 1)}%`,
        fmt(idle.inMsgs / s),
        fmt(idle.outMsgs / s),
        fmt(idle.outBytes / s / 1024, 1),
        `${fmt((fleetCpu / s) * 100, 1)}%`,
        fmt(fleetRss),
        fmt(perJobMsgs),
        fmt(perJobBytes / 1024, 1),
      ]);
      log(`idle ${n}: ${rows.at(-1)?.join(" | ")}`);
    } finally {
      await fleet.stop();
    }
  }
  return rows;
}

async function scaleOut(members: Member[]): Promise<string[][]> {
  const rows: string[][] = [];
  for (const workspace of ["memory", "spawn"]) {
    for (const w of settings.scale) {
      const prefix = `fleet${workspace}${w}`;
      await using path = await openBoxcarPath({
        url: members[0]?.server.url as string,
        prefix,
        providers: [],
        concurrency: 1,
        noWorker: true,
      });
      const fleet = await startWorkers(members, prefix, w, 1, 4, workspace);
      try {
        for (let i = 0; i < 50; i++) await path.run(i); // warm-up
        let next = 0;
        const started = performance.now();
        await Promise.all(
          Array.from({ length: 64 }, async () => {
            while (next < settings.jobs) await path.run(1_000 + next++);
          }),
        );
        const seconds = (performance.now() - started) / 1000;
        if (path.unsuccessful > 0) throw new Error(`${path.unsuccessful} jobs did not succeed`);
        rows.push([workspace === "memory" ? "no-op (memory workspace)" : "host sandbox, `true`", String(w), fmt(settings.jobs / seconds)]);
        log(`scale ${workspace} ${w}: ${fmt(settings.jobs / seconds)} jobs/s`);
      } finally {
        await fleet.stop();
      }
    }
  }
  return rows;
}

const root = await mkdtemp(join(tmpdir(), "boxcar-fleet-"));
const members = await startCluster(root);
try {
  log(`cluster up; ${new Date().toISOString()}`);
  const idle = await idleCosts(members);
  console.log(`\nIdle workers (${settings.window} s window; servers summed; per job: with ${settings.trickle} jobs/s trickling in)\n`);
  console.log(
    table([
      [
        "workers",
        "start (s)",
        "servers CPU",
        "msgs in/s",
        "msgs out/s",
        "KiB out/s",
        "workers CPU",
        "workers RSS MiB",
        "msgs out per job",
        "KiB out per job",
      ],
      ...idle,
    ]),
  );
  const scale = await scaleOut(members);
  console.log(`\nScale-out (${settings.jobs} jobs, 64 in flight; one dispatcher)\n`);
  console.log(table([["path", "worker processes", "jobs/s"], ...scale]));
} finally {
  await Promise.all(members.map((m) => m.server.stop()));
  await rm(root, { recursive: true, force: true });
}
