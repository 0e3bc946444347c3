/**
 * The lifeline's cost (docs/reliability.md#one-attempt-alive): a host agent now starts as `sh`
 * running the sentinel and then `exec`ing the agent, with a fourth pipe, after a lookup of the
 * command on PATH. Measured as the host sandbox's exec of `/bin/true` (with an attempt lease, as a
 * job's agent runs) against a bare detached spawn of `/bin/true` (what the exec was before the
 * lifeline), one at a time, interleaved in rounds, in one run. `pnpm bench:lifeline`;
 * BENCH_LIFELINE_N sets the spawns of each per round, BENCH_LIFELINE_ROUNDS the rounds.
 */
import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { AttemptLease, createHostSandboxProvider } from "@boxcar/worker";
import { envInt, gitCommit, ms, summarize, table } from "./stats.js";

const N = envInt("BENCH_LIFELINE_N", 100);
const ROUNDS = envInt("BENCH_LIFELINE_ROUNDS", 5);
const env = { PATH: process.env.PATH ?? "/usr/bin:/bin" };

const root = await mkdtemp(join(tmpdir(), "boxcar-bench-lifeline-"));
const sandbox = await createHostSandboxProvider({ root }).create({
  id: "sbx-bench",
  jobId: "bench",
  attempt: 1,
  workerId: "bench",
  runtime: { sandbox: "host", network: "none", timeout: 60_000, limits: {} },
});
const lease = new AttemptLease(30_000);
const signal = new AbortController().signal;

/** The spawn the host sandbox made before the lifeline: detached, three pipes, waited on until they close. */
function bareSpawn(): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn("/bin/true", [], { cwd: sandbox.workspace, env, detached: true, stdio: ["pipe", "pipe", "pipe"] });
    child.stdin.end();
    child.stdout.resume();
    child.stderr.resume();
    child.once("error", reject);
    child.once("close", (code) => (code === 0 ? resolve() : reject(new Error(`true exited with ${code}`))));
  });
}

async function underLifeline(): Promise<void> {
  const result = await sandbox.exec(["/bin/true"], { env, signal, onOutput: () => {}, attemptLease: lease });
  if (result.exitCode !== 0) throw new Error(`true exited with ${result.exitCode}`);
}

const samples: Record<"bare" | "lifeline", number[]> = { bare: [], lifeline: [] };
const time = async (arm: keyof typeof samples, run: () => Promise<void>, keep: boolean) => {
  for (let i = 0; i < N; i++) {
    const started = performance.now();
    await run();
    if (keep) samples[arm].push(performance.now() - started);
  }
};
await time("bare", bareSpawn, false);
await time("lifeline", underLifeline, false);
for (let round = 0; round < ROUNDS; round++) {
  // Alternate which goes first, so neither always follows the other.
  const arms: [keyof typeof samples, () => Promise<void>][] = [
    ["bare", bareSpawn],
    ["lifeline", underLifeline],
  ];
  if (round % 2 === 1) arms.reverse();
  for (const [arm, run] of arms) await time(arm, run, true);
}
await sandbox.destroy();
await rm(root, { recursive: true, force: true });

const bare = summarize(samples.bare);
const lifeline = summarize(samples.lifeline);
console.log(`lifeline bench, commit ${gitCommit()}, ${cpus().length} CPUs, ${ROUNDS} rounds of ${N} each, interleaved`);
console.log(
  table([
    ["start and end of /bin/true", "p50 ms", "p90 ms", "p99 ms", "mean ms"],
    ["bare detached spawn (the host exec before)", ms(bare.p50), ms(bare.p90), ms(bare.p99), ms(bare.mean)],
    ["host sandbox exec under the lifeline", ms(lifeline.p50), ms(lifeline.p90), ms(lifeline.p99), ms(lifeline.mean)],
  ]),
);
console.log(`the lifeline adds ${ms(lifeline.p50 - bare.p50)} ms at p50, ${ms(lifeline.mean - bare.mean)} ms on average`);
