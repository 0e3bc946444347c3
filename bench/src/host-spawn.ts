import { spawn } from "node:child_process";
import { createHostSandboxProvider } from "@boxcar/worker";
import { sequential } from "./load.js";
import { type LatencySummary, summarize } from "./stats.js";

/** A bare spawn of `true` with the options the host sandbox uses, waited on until its pipes close. */
function spawnTrue(cwd: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn("true", [], {
      cwd,
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
    });
    child.stdout.resume();
    child.stderr.resume();
    child.once("error", reject);
    child.once("close", (code) => (code === 0 ? resolve() : reject(new Error(`true exited with ${code}`))));
  });
}

export async function measureBareSpawn(cwd: string, count: number, warmup: number): Promise<LatencySummary> {
  const run = () => spawnTrue(cwd);
  await sequential(run, warmup);
  return summarize(await sequential(run, count));
}

/**
 * The host sandbox's own cost per job, without NATS: create (temporary workspace), the layout
 * the worker writes (two folders, the input file), exec `true`, look for the result file and
 * artifacts, destroy.
 */
export async function measureHostSandbox(root: string, count: number, warmup: number): Promise<LatencySummary> {
  const provider = createHostSandboxProvider({ root });
  const env = { PATH: process.env.PATH ?? "/usr/bin:/bin" };
  const signal = new AbortController().signal;
  const run = async (i: number) => {
    const sandbox = await provider.create({
      id: `sbx-${i}`,
      jobId: `job-${i}`,
      attempt: 1,
      workerId: "bench",
      runtime: { sandbox: "host", network: "none", timeout: 60_000, limits: {} },
    });
    try {
      await sandbox.mkdir(".boxcar/tmp");
      await sandbox.mkdir("out");
      await sandbox.writeFile(".boxcar/input.json", new TextEncoder().encode(String(i)));
      const result = await sandbox.exec(["true"], { env, signal, onOutput: () => {} });
      if (result.exitCode !== 0) throw new Error(`true exited with ${result.exitCode}`);
      await sandbox.listFiles();
      await sandbox.readFile(".boxcar/result.json");
    } finally {
      await sandbox.destroy();
    }
  };
  await sequential(run, warmup);
  return summarize(await sequential(run, count, warmup));
}
