import { type ChildProcess, spawn } from "node:child_process";
import { freePort } from "@boxcar/fabric";
import { scratch } from "@boxcar/testing";
import { BOXCAR_BIN } from "./cli.js";

export interface UpProcess extends AsyncDisposable {
  readonly child: ChildProcess;
  readonly cwd: string;
  readonly port: number;
  /** Everything it wrote so far, stdout and stderr together. */
  output(): string;
}

/** Runs `boxcar up ARGS` in a scratch folder (or `at` one, on its port), `env` added to its environment; returns the child and its combined output. */
export async function spawnUp(args: string[], at?: { cwd: string; port: number }, env: NodeJS.ProcessEnv = {}): Promise<UpProcess> {
  const folder = at ? { path: at.cwd, [Symbol.asyncDispose]: async () => {} } : await scratch("boxcar-up-");
  const cwd = folder.path;
  const port = at?.port ?? (await freePort());
  const child = spawn(process.execPath, [BOXCAR_BIN, "up", "--port", String(port), "--log-format", "json", ...args], {
    cwd,
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, BOXCAR_LOG_LEVEL: "info", ...env },
  });
  let output = "";
  child.stdout?.setEncoding("utf8").on("data", (d: string) => (output += d));
  child.stderr?.setEncoding("utf8").on("data", (d: string) => (output += d));
  return { child, cwd, port, output: () => output, [Symbol.asyncDispose]: () => folder[Symbol.asyncDispose]() };
}
