/**
 * The Docker sandbox benchmark: a no-op job's round trip through Boxcar with the Docker sandbox
 * (submit -> final record), with the workspace bind-mounted and copied, next to the bare
 * container lifecycle with the same hardening (create + start + wait + remove through
 * dockerode), measured in the same run, one at a time, interleaved.
 * `pnpm bench:docker`; BENCH_DOCKER_N sets the number of jobs.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { startNatsServer } from "@boxcar/fabric";
import { createDockerSandboxProvider, hardenedHostConfig } from "@boxcar/worker";
import Docker from "dockerode";
import { openBoxcarPath } from "./boxcar-path.js";
import { envInt, ms, summarize, table } from "./stats.js";

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

const server = await startNatsServer();
try {
  // One system per way of getting the workspace into the container, both served by this
  // process, measured interleaved with the bare lifecycle: job i of each path runs back to back,
  // so a busy moment on this shared machine falls on all three alike.
  const open = (workspace: "bind" | "copy") =>
    openBoxcarPath({
      url: server.url,
      prefix: `benchdocker${workspace}`,
      providers: [createDockerSandboxProvider({ prefix: `benchdocker${workspace}`, workspace })],
      concurrency: 4,
      sandbox: "docker",
      connectOptions: { noAsyncTraces: true },
    });
  await using bind = await open("bind");
  await using copy = await open("copy");
  const samples = { bare: [] as number[], bind: [] as number[], copy: [] as number[] };
  for (let i = 0; i < WARMUP + N; i++) {
    const round = { bare: await timed(bareLifecycle), bind: await timed(() => bind.run(i)), copy: await timed(() => copy.run(i)) };
    if (i < WARMUP) continue;
    for (const path of ["bare", "bind", "copy"] as const) samples[path].push(round[path]);
  }
  if (bind.unsuccessful + copy.unsuccessful > 0) throw new Error("some jobs did not succeed: the run is not valid");
  const bare = summarize(samples.bare);
  const jobs = { bind: summarize(samples.bind), copy: summarize(samples.copy) };

  const overhead = (a: number, b: number) => `${ms(a - b)} ms (${(((a - b) / b) * 100).toFixed(0)}%)`;
  process.stdout.write(
    `\nDocker sandbox, ${N} jobs of each path one at a time, interleaved (engine ${engine.ServerVersion}, ${engine.Driver}, ${cpus().length} CPUs)\n\n${table(
      [
        ["path", "p50 ms", "p95 ms", "p99 ms"],
        ["bare hardened container lifecycle (dockerode)", ms(bare.p50), ms(bare.p95), ms(bare.p99)],
        ["Boxcar job, workspace bind-mounted (submit -> final record)", ms(jobs.bind.p50), ms(jobs.bind.p95), ms(jobs.bind.p99)],
        ["Boxcar job, workspace copied in and out", ms(jobs.copy.p50), ms(jobs.copy.p95), ms(jobs.copy.p99)],
      ],
    )}\n\nBoxcar adds, bind-mounted: ${overhead(jobs.bind.p50, bare.p50)} at p50 and ${overhead(jobs.bind.p95, bare.p95)} at p95; copied: ${overhead(jobs.copy.p50, bare.p50)} at p50 (target: within 15%).\n`,
  );
  const dir = join("bench", "results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `docker-${new Date().toISOString().replaceAll(":", "-")}.json`);
  writeFileSync(
    file,
    `${JSON.stringify({ engine: { version: engine.ServerVersion, driver: engine.Driver }, jobs: N, bare, bind: jobs.bind, copy: jobs.copy }, null, 2)}\n`,
  );
  process.stdout.write(`results: ${file}\n`);
} finally {
  await server.stop();
}
