/**
 * The Docker sandbox benchmark: a no-op job's round trip through Boxcar with the Docker sandbox
 * (submit -> final record), cold with the workspace bind-mounted, cold with it copied, and from a
 * warm pool, next to the bare container lifecycle with the same hardening (create + start + wait
 * + remove through dockerode), measured in the same run, one at a time, interleaved. For the
 * Boxcar paths also the start: from the worker's claim of the job (its record's `startedAt`) to
 * the agent's first instruction (it prints the time). And what a warm container holds while it
 * waits: its cgroup's memory and its engine shim's resident memory.
 * `pnpm bench:docker`; BENCH_DOCKER_N sets the number of jobs.
 */
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { startNatsServer } from "@boxcar/fabric";
import { isTerminal, type JobRecord } from "@boxcar/protocol";
import { createDockerSandboxProvider, hardenedHostConfig, type SandboxProvider } from "@boxcar/worker";
import Docker from "dockerode";
import { openBoxcarPath } from "./boxcar-path.js";
import { envInt, type LatencySummary, ms, summarize, table } from "./stats.js";

const N = envInt("BENCH_DOCKER_N", 40);
const WARMUP = 3;
const IMAGE = process.env.BOXCAR_AGENT_IMAGE ?? "boxcar-agent:latest";
const confinement = { network: "none", limits: { cpus: 1, memory: 1024 ** 3, pids: 256 }, tmpBytes: 64 * 1024 ** 2 };

const docker = new Docker();
const engine = await docker.info();

/** One hardened container running `true`, from create to removal. */
async function bareLifecycle(): Promise<void> {
  const container = await docker.createContainer({
    Image: IMAGE,
    Cmd: ["true"],
    Entrypoint: [],
    User: "1000:1000",
    WorkingDir: "/workspace",
    HostConfig: hardenedHostConfig(confinement),
  });
  await container.start();
  await container.wait();
  await container.remove({ force: true, v: true });
}

/** Time of one call of `run`, in ms. */
async function timed(run: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await run();
  return performance.now() - start;
}

/** The agent of every Boxcar path: its result is the time it started, in microseconds. */
const STAMP = ["sh", "-c", 'printf \'{"output":%s}\' "$(date +%s%6N)" > "$BOXCAR_RESULT_FILE"'];

/** Resident memory (kB) of the engine's shim process for each container id given. */
function shimRssKb(ids: readonly string[]): number[] {
  const found: number[] = [];
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      if (!cmdline.includes("containerd-shim") || !ids.some((id) => cmdline.includes(id))) continue;
      const rss = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
      if (rss) found.push(Number(rss));
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

const server = await startNatsServer();
try {
  // One system per path, all served by this process, measured interleaved with the bare
  // lifecycle: job i of each path runs back to back, so a busy moment on this shared machine
  // falls on all alike.
  const paths = ["bind", "copy", "warm"] as const;
  type Path = (typeof paths)[number];
  const providers = Object.fromEntries(
    paths.map((path) => [
      path,
      createDockerSandboxProvider({
        prefix: `benchdocker${path}`,
        workspace: path === "copy" ? "copy" : "bind",
        ...(path === "warm" ? { warm: 2 } : {}),
      }),
    ]),
  ) as Record<Path, SandboxProvider>;
  const open = (path: Path) =>
    openBoxcarPath({
      url: server.url,
      prefix: `benchdocker${path}`,
      providers: [providers[path]],
      concurrency: 4,
      sandbox: "docker",
      command: STAMP,
      warm: path === "warm",
      connectOptions: { noAsyncTraces: true },
    });
  const opened = { bind: await open("bind"), copy: await open("copy"), warm: await open("warm") };
  await using _bind = opened.bind;
  await using _copy = opened.copy;
  await using _warm = opened.warm;
  const finals = new Map<string, JobRecord>();
  for (const path of paths) opened[path].listen((record) => isTerminal(record.state) && finals.set(record.id, record));
  /** One job on `path`: its whole time, and from its claim to its agent's start. */
  const job = async (path: Path, i: number) => {
    const started = performance.now();
    const id = await opened[path].submit(i);
    await opened[path].done(id);
    const whole = performance.now() - started;
    const record = finals.get(id);
    const agentStartedMs = Number(record?.result?.output) / 1000;
    return { whole, start: agentStartedMs - Date.parse(record?.startedAt ?? "") };
  };
  await new Promise((r) => setTimeout(r, 2_000)); // the warm pool fills
  const samples = { bare: [] as number[], bind: [] as number[], copy: [] as number[], warm: [] as number[] };
  const starts = { bind: [] as number[], copy: [] as number[], warm: [] as number[] };
  for (let i = 0; i < WARMUP + N; i++) {
    const bare = await timed(bareLifecycle);
    const round = { bind: await job("bind", i), copy: await job("copy", i), warm: await job("warm", i) };
    // The pool makes a replacement after each warm job (a create and start, off the job's path):
    // let it finish, so it does not fall on the next round's other paths.
    while ((providers.warm.warmReady?.() ?? 0) < 2) await new Promise((r) => setTimeout(r, 5));
    if (i < WARMUP) continue;
    samples.bare.push(bare);
    for (const path of paths) {
      samples[path].push(round[path].whole);
      starts[path].push(round[path].start);
    }
  }
  if (paths.some((p) => opened[p].unsuccessful > 0)) throw new Error("some jobs did not succeed: the run is not valid");

  // What a ready container costs while it waits.
  await new Promise((r) => setTimeout(r, 1_000));
  const ready = await docker.listContainers({ filters: { label: ["boxcar.prefix=benchdockerwarm", "boxcar.warm=1"] } });
  const cgroupBytes: number[] = [];
  for (const c of ready) {
    const stats = (await docker.getContainer(c.Id).stats({ stream: false })) as { memory_stats?: { usage?: number } };
    cgroupBytes.push(stats.memory_stats?.usage ?? 0);
  }
  const shims = shimRssKb(ready.map((c) => c.Id));
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);
  const memory = { containers: ready.length, cgroupMiB: mean(cgroupBytes) / 1024 ** 2, shimMiB: mean(shims) / 1024 };

  const bare = summarize(samples.bare);
  const whole: Record<Path, LatencySummary> = {
    bind: summarize(samples.bind),
    copy: summarize(samples.copy),
    warm: summarize(samples.warm),
  };
  const start: Record<Path, LatencySummary> = { bind: summarize(starts.bind), copy: summarize(starts.copy), warm: summarize(starts.warm) };
  const overhead = (a: number, b: number) => `${ms(a - b)} ms (${(((a - b) / b) * 100).toFixed(0)}%)`;
  const label: Record<Path, string> = {
    bind: "cold, workspace bind-mounted",
    copy: "cold, workspace copied in and out",
    warm: "warm pool",
  };
  process.stdout.write(
    `\nDocker sandbox, ${N} jobs of each path one at a time, interleaved (engine ${engine.ServerVersion}, ${engine.Driver}, ${cpus().length} CPUs)\n\n${table(
      [
        ["path", "p50 ms", "p95 ms", "p99 ms", "claim -> agent start p50 ms", "p95 ms"],
        ["bare hardened container lifecycle (dockerode)", ms(bare.p50), ms(bare.p95), ms(bare.p99), "", ""],
        ...paths.map((p) => [
          `Boxcar job, ${label[p]} (submit -> final record)`,
          ms(whole[p].p50),
          ms(whole[p].p95),
          ms(whole[p].p99),
          ms(start[p].p50),
          ms(start[p].p95),
        ]),
      ],
    )}\n\nBoxcar adds over the bare lifecycle at p50: bind-mounted ${overhead(whole.bind.p50, bare.p50)}, copied ${overhead(whole.copy.p50, bare.p50)}, warm ${overhead(whole.warm.p50, bare.p50)} (targets: cold within 15%, warm below it; warm start p50 under 20 ms).\n` +
      `A ready warm container holds ${memory.cgroupMiB.toFixed(1)} MiB in its cgroup and its engine shim ${memory.shimMiB.toFixed(1)} MiB resident (mean of ${memory.containers}).\n`,
  );
  const dir = join("bench", "results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `docker-${new Date().toISOString().replaceAll(":", "-")}.json`);
  writeFileSync(
    file,
    `${JSON.stringify({ engine: { version: engine.ServerVersion, driver: engine.Driver }, jobs: N, bare, whole, start, memory }, null, 2)}\n`,
  );
  process.stdout.write(`results: ${file}\n`);
} finally {
  await server.stop();
}
