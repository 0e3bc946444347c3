/**
 * The session exec benchmark: the round trip of one command in an open session (request to exit
 * code, `true`) through the whole path a user's program takes (SDK -> dispatcher -> worker ->
 * sandbox -> back), in a Docker session (its resident helper) and a host session, next to a bare
 * `docker exec` of `true` in a running container with the same hardening (exec create + start +
 * wait for its end + inspect, through dockerode), measured in the same run, one at a time,
 * interleaved. Then a job's round trip (submit to its end, `true`) run in the Docker session
 * (`submit --session`) against the same job in a fresh Docker sandbox, interleaved.
 * `pnpm bench:session-exec`; BENCH_SESSION_N sets the number of commands of each,
 * BENCH_SESSION_JOBS the number of jobs of each.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { hardenedHostConfig } from "@boxcar/worker";
import Docker from "dockerode";
import { openSessionSystem } from "./session-system.js";
import { envInt, gitCommit, ms, summarize, table } from "./stats.js";

const N = envInt("BENCH_SESSION_N", 300);
const JOBS = envInt("BENCH_SESSION_JOBS", 40);
const WARMUP = 20;
const PREFIX = "benchsession";
const IMAGE = process.env.BOXCAR_AGENT_IMAGE ?? "boxcar-agent:latest";

const docker = new Docker();
const system = await openSessionSystem(PREFIX);
const { engine, client } = system;
await client.applyAgent({ name: "box", command: ["true"], sessions: true, runtime: { sandbox: "docker" } });
await client.applyAgent({ name: "hosted", command: ["true"], sessions: true, trusted: true, runtime: { sandbox: "host" } });

// The bare peer: a running container with the job containers' hardening, and `docker exec` in it.
const bare = await docker.createContainer({
  Image: IMAGE,
  Cmd: ["sleep", "infinity"],
  Entrypoint: [],
  User: "1000:1000",
  WorkingDir: "/workspace",
  HostConfig: hardenedHostConfig({ network: "none", limits: { cpus: 1, memory: 1024 ** 3, pids: 256 }, tmpBytes: 64 * 1024 ** 2 }),
});
try {
  await bare.start();
  const dockerExec = async () => {
    const exec = await bare.exec({ Cmd: ["true"], AttachStdout: true, AttachStderr: true });
    const stream = await exec.start({ hijack: true, stdin: false });
    await new Promise<void>((resolve) => {
      stream.on("end", resolve);
      stream.on("close", resolve);
      stream.resume();
    });
    const { ExitCode } = await exec.inspect();
    if (ExitCode !== 0) throw new Error(`docker exec true exited ${ExitCode}`);
  };
  const sessions = {
    docker: await client.openSession({ agent: "box" }),
    host: await client.openSession({ agent: "hosted" }),
  };
  /** For each session, how long its sandbox took (the reply's `durationMs`): the rest is the way there and back. */
  const inSandbox = new Map<string, number[]>();
  const inSession = (id: string) => async () => {
    const ran = await client.execInSession({ id, argv: ["true"] });
    if (ran.exitCode !== 0) throw new Error(`true exited ${ran.exitCode} in session ${id}`);
    inSandbox.set(id, [...(inSandbox.get(id) ?? []), ran.durationMs]);
  };
  const paths = {
    "Docker session exec (SDK -> dispatcher -> worker -> helper)": inSession(sessions.docker.id),
    "host session exec (the same path, a host process)": inSession(sessions.host.id),
    "bare docker exec in a running container (dockerode)": dockerExec,
  };
  const samples = Object.fromEntries(Object.keys(paths).map((p) => [p, [] as number[]]));
  for (let i = 0; i < WARMUP + N; i++) {
    for (const [path, run] of Object.entries(paths)) {
      const started = performance.now();
      await run();
      if (i >= WARMUP) samples[path]?.push(performance.now() - started);
    }
  }
  // A job's round trip: in the session's sandbox, or in one of its own made for it.
  const job = (session?: string) => async () => {
    const { job: submitted } = await client.submit({ agent: "box", ...(session ? { session } : {}) });
    const done = await client.waitForJob(submitted.id);
    if (done.state !== "succeeded") throw new Error(`job ${done.id} ended ${done.state}`);
  };
  const jobPaths = {
    "job in the Docker session (submit --session, to its end)": job(sessions.docker.id),
    "job in a fresh Docker sandbox (submit, to its end)": job(),
  };
  const jobSamples = Object.fromEntries(Object.keys(jobPaths).map((p) => [p, [] as number[]]));
  for (let i = 0; i < 3 + JOBS; i++) {
    for (const [path, run] of Object.entries(jobPaths)) {
      const started = performance.now();
      await run();
      if (i >= 3) jobSamples[path]?.push(performance.now() - started);
    }
  }
  for (const s of Object.values(sessions)) await client.closeSession(s.id);
  const summaries = Object.fromEntries(Object.entries(samples).map(([p, s]) => [p, summarize(s)]));
  const jobSummaries = Object.fromEntries(Object.entries(jobSamples).map(([p, s]) => [p, summarize(s)]));
  const sandboxPart = {
    docker: summarize((inSandbox.get(sessions.docker.id) ?? []).slice(WARMUP)),
    host: summarize((inSandbox.get(sessions.host.id) ?? []).slice(WARMUP)),
  };
  process.stdout.write(
    `\nSession exec round trip, ${N} commands of each path one at a time, interleaved (engine ${engine.ServerVersion}, ${cpus().length} CPUs)\n\n${table(
      [["path", "p50 ms", "p95 ms", "p99 ms"], ...Object.entries(summaries).map(([p, s]) => [p, ms(s.p50), ms(s.p95), ms(s.p99)])],
    )}\n\nOf which in the sandbox (the reply's durationMs) at p50: Docker ${ms(sandboxPart.docker.p50)} ms (the helper starting \`true\` and reporting), host ${ms(sandboxPart.host.p50)} ms.\n(target: a Docker session's p50 under 5 ms)\n\nA job's round trip, ${JOBS} of each, interleaved\n\n${table(
      [["path", "p50 ms", "p95 ms", "p99 ms"], ...Object.entries(jobSummaries).map(([p, s]) => [p, ms(s.p50), ms(s.p95), ms(s.p99)])],
    )}\n`,
  );
  const dir = join("bench", "results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `session-exec-${new Date().toISOString().replaceAll(":", "-")}.json`);
  writeFileSync(
    file,
    `${JSON.stringify({ commit: gitCommit(), engine: engine.ServerVersion, commands: N, summaries, sandboxPart, jobs: JOBS, jobSummaries }, null, 2)}\n`,
  );
  process.stdout.write(`results: ${file}\n`);
} finally {
  await bare.remove({ force: true });
  await system.close();
}
