/**
 * The Docker sandbox benchmark: a no-op job's round trip through Boxcar with the Docker sandbox
 * (submit -> final record), next to the bare container lifecycle with the same hardening
 * (create + start + wait + remove through dockerode), measured in the same run, one at a time.
 * `pnpm bench:docker`; BENCH_DOCKER_N sets the number of jobs.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { startNatsServer } from "@boxcar/fabric";
import { createDockerSandboxProvider, hardenedHostConfig } from "@boxcar/worker";
import Docker from "dockerode";
import { openBoxcarPath } from "./boxcar-path.js";
import { sequential } from "./load.js";
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

const server = await startNatsServer();
try {
  const bareSamples = await sequential(bareLifecycle, WARMUP + N);
  const bare = summarize(bareSamples.slice(WARMUP));

  await using boxcar = await openBoxcarPath({
    url: server.url,
    prefix: "benchdocker",
    providers: [createDockerSandboxProvider({ prefix: "benchdocker" })],
    concurrency: 4,
    sandbox: "docker",
    connectOptions: { noAsyncTraces: true },
  });
  const jobSamples = await sequential(boxcar.run, WARMUP + N);
  if (boxcar.unsuccessful > 0) throw new Error(`${boxcar.unsuccessful} jobs did not succeed: the run is not valid`);
  const job = summarize(jobSamples.slice(WARMUP));

  const overhead = (a: number, b: number) => `${ms(a - b)} ms (${(((a - b) / b) * 100).toFixed(0)}%)`;
  process.stdout.write(
    `\nDocker sandbox, ${N} jobs one at a time (engine ${engine.ServerVersion}, ${engine.Driver}, ${cpus().length} CPUs)\n\n${table([
      ["path", "p50 ms", "p95 ms", "p99 ms"],
      ["bare hardened container lifecycle (dockerode)", ms(bare.p50), ms(bare.p95), ms(bare.p99)],
      ["Boxcar job, Docker sandbox (submit -> final record)", ms(job.p50), ms(job.p95), ms(job.p99)],
    ])}\n\nBoxcar adds ${overhead(job.p50, bare.p50)} at p50 and ${overhead(job.p95, bare.p95)} at p95 (target: within 15%).\n`,
  );
  const dir = join("bench", "results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `docker-${new Date().toISOString().replaceAll(":", "-")}.json`);
  writeFileSync(
    file,
    `${JSON.stringify({ engine: { version: engine.ServerVersion, driver: engine.Driver }, jobs: N, bare, job }, null, 2)}\n`,
  );
  process.stdout.write(`results: ${file}\n`);
} finally {
  await server.stop();
}
