import { type ChildProcess, execFile, spawn } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { authFor } from "@boxcar/testing";

export const BOXCAR_BIN = fileURLToPath(new URL("../../packages/cli/dist/bundle/boxcar.js", import.meta.url));

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * The credentials a command logs in with on a fixture server: `dispatcher` and `worker` their
 * role's (a worker trusting the dispatcher's key), anything else the admin's.
 */
function credentialsEnv(url: string, args: readonly string[]): NodeJS.ProcessEnv {
  const auth = authFor(url);
  if (!auth) return {};
  const role = args[0] === "dispatcher" || args[0] === "worker" ? args[0] : "admin";
  return {
    NATS_CREDS: auth.credsFile(role),
    ...(role === "worker" ? { BOXCAR_DISPATCHER_KEYS: join(auth.dir, "dispatchers.pub") } : {}),
  };
}

/**
 * Runs `boxcar ARGS` as a user would, against `url` with `prefix` (the build at `bin`, default
 * this one), with `input` on its stdin. The prefix goes right after the command's name, so that
 * what follows a `--` (an exec's command) is left as it is.
 */
export function boxcar(
  url: string,
  prefix: string,
  args: string[],
  env: NodeJS.ProcessEnv = {},
  bin = BOXCAR_BIN,
  input = "",
): Promise<CliResult> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [bin, ...args.slice(0, 1), "--prefix", prefix, ...args.slice(1)],
      { env: { ...process.env, BOXCAR_NATS_URL: url, ...credentialsEnv(url, args), ...env }, maxBuffer: 16 * 1024 * 1024, timeout: 60_000 },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === "number" ? err.code : 1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
    child.stdin?.end(input);
  });
}

/** Starts a long-running `boxcar` role (dispatcher, worker) as a child process (the build at `bin`, default this one). */
export function spawnBoxcar(
  url: string,
  prefix: string,
  args: string[],
  env: NodeJS.ProcessEnv = {},
  bin = BOXCAR_BIN,
): ChildProcess & { output: () => string } {
  // Roles log; their logs are read as JSON. Other commands (events, logs, session) have no log format to set.
  const logFormat = ["dispatcher", "worker", "up"].includes(args[0] ?? "") ? ["--log-format", "json"] : [];
  const child = spawn(process.execPath, [bin, ...args, "--prefix", prefix, ...logFormat], {
    env: { ...process.env, BOXCAR_NATS_URL: url, ...credentialsEnv(url, args), ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout?.setEncoding("utf8").on("data", (d: string) => (output += d));
  child.stderr?.setEncoding("utf8").on("data", (d: string) => (output += d));
  return Object.assign(child, { output: () => output });
}

export function exited(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
  return new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
}
