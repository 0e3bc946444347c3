import { spawn } from "node:child_process";
import { readdir, readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import { freePort } from "@boxcar/fabric";
import { eventually, scratch } from "@boxcar/testing";
import { expect, test } from "vitest";
import { BOXCAR_BIN, exited } from "./helpers/cli.js";
import { isAlive, waitGone } from "./helpers/process.js";
import { spawnUp } from "./helpers/up.js";

/** Pids of the live nats-server processes whose command line names `dir` (their config is there). */
async function natsServerPids(dir: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmd = await readFile(`/proc/${entry}/cmdline`, "utf8");
      if (cmd.includes("nats-server") && cmd.includes(dir) && isAlive(Number(entry))) pids.push(Number(entry));
    } catch {
      // the process ended while we looked
    }
  }
  return pids;
}

test("boxcar up --demo runs the demo job live, downloads its artifacts, and leaves no process behind", async () => {
  await using run = await spawnUp(["--demo"]);
  const result = await exited(run.child);
  const output = run.output();
  expect(output).toContain("boxcar is up");
  expect(output).toMatch(/job\s+progress\s+section 1\/3: queue/);
  expect(output).toMatch(/state\s+succeeded/);
  expect(result).toEqual({ code: 0, signal: null });
  // The demo ends with its job: no dashboard to open, and a pointer to one that stays.
  expect(output).not.toContain("dashboard:");
  expect(output).toContain("live dashboard");
  const artifacts = await readdir(join(run.cwd, ".boxcar", "demo-artifacts"), { recursive: true });
  expect(artifacts.filter((p) => p.endsWith("report.md") || p.endsWith("index.json"))).toHaveLength(2);
  expect(await natsServerPids(run.cwd)).toEqual([]);
}, 60_000);

test("boxcar up stops everything on SIGINT (Ctrl-C) and keeps its data for the next start", async () => {
  await using run = await spawnUp([]);
  await eventually(async () => (run.output().includes("Ctrl-C stops everything") ? true : undefined), "boxcar up to be ready");
  // It printed its dashboard, which serves the page.
  const dashboard = /dashboard: (http:\/\/127\.0\.0\.1:\d+)/.exec(run.output())?.[1];
  expect((await fetch(`${dashboard}/`)).status).toBe(200);
  const started = await natsServerPids(run.cwd);
  expect(started).toHaveLength(1);
  run.child.kill("SIGINT");
  expect(await exited(run.child)).toEqual({ code: 0, signal: null });
  expect(await waitGone(started[0] as number)).toBe(true);
  expect(await readdir(join(run.cwd, ".boxcar", "data", "jetstream"))).not.toHaveLength(0);
}, 60_000);

test("a boxcar up killed with SIGKILL leaves its nats-server running; the next boxcar up in that folder stops it and starts", async () => {
  await using first = await spawnUp([]);
  const ready = (run: { output(): string }) =>
    eventually(async () => (run.output().includes("Ctrl-C stops everything") ? true : undefined), "boxcar up to be ready");
  await ready(first);
  const [orphan] = await natsServerPids(first.cwd);
  first.child.kill("SIGKILL");
  await exited(first.child);
  expect(isAlive(orphan as number)).toBe(true);

  await using second = await spawnUp([], { cwd: first.cwd, port: first.port });
  await ready(second);
  expect(second.output()).toContain(`stopped the nats-server (pid ${orphan}) an earlier boxcar up left running`);
  expect(isAlive(orphan as number)).toBe(false);
  expect(await natsServerPids(first.cwd)).toHaveLength(1);
  second.child.kill("SIGINT");
  expect(await exited(second.child)).toEqual({ code: 0, signal: null });
  expect(await natsServerPids(first.cwd)).toEqual([]);
}, 90_000);

test("boxcar up on a port that is taken says so and exits 4, touching nothing there", async () => {
  const { createServer } = await import("node:net");
  const blocker = createServer();
  const port = await freePort();
  await new Promise<void>((r) => blocker.listen(port, "127.0.0.1", () => r()));
  try {
    await using folder = await scratch("boxcar-up-");
    const child = spawn(process.execPath, [BOXCAR_BIN, "up", "--port", String(port)], {
      cwd: folder.path,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    expect(await exited(child)).toEqual({ code: 4, signal: null });
    expect(stderr).toContain(`port ${port} is already in use`);
  } finally {
    blocker.close();
  }
});

test("boxcar up refuses to listen beyond this machine without --auth, and names the flag", async () => {
  await using run = await spawnUp(["--listen", "0.0.0.0"]);
  expect(await exited(run.child)).toEqual({ code: 2, signal: null });
  expect(run.output()).toContain("add --auth");
  expect(await natsServerPids(run.cwd)).toEqual([]);
}, 30_000);

test("boxcar up --auth runs every role with its own credential; commands in its folder use the admin's, others need one", async () => {
  await using run = await spawnUp(["--auth"]);
  await eventually(async () => (run.output().includes("Ctrl-C stops everything") ? true : undefined), "boxcar up to be ready");
  const url = `nats://127.0.0.1:${run.port}`;
  const cli = (args: string[], cwd: string) =>
    new Promise<{ code: number; out: string }>((resolve) => {
      const child = spawn(process.execPath, [BOXCAR_BIN, ...args], { cwd, env: { ...process.env, BOXCAR_NATS_URL: url } });
      let out = "";
      child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
      child.stderr.setEncoding("utf8").on("data", (d: string) => (out += d));
      child.once("exit", (code) => resolve({ code: code ?? -1, out }));
    });
  const submitted = await cli(["submit", "hello", "--prompt", "hi", "--wait"], run.cwd);
  expect(submitted.out).toMatch(/state\s+succeeded/);
  expect(submitted.code).toBe(0);
  const creds = join(run.cwd, ".boxcar", "auth", "submitter.creds");
  expect((await stat(creds)).mode & 0o777).toBe(0o600);
  await using elsewhere = await scratch("boxcar-elsewhere-");
  const refused = await cli(["jobs"], elsewhere.path);
  expect(refused.code).toBe(4);
  expect(refused.out).toContain("Authorization Violation");
  const asSubmitter = await cli(["jobs", "--creds", creds], elsewhere.path);
  expect(asSubmitter.code).toBe(0);
  run.child.kill("SIGINT");
  expect(await exited(run.child)).toEqual({ code: 0, signal: null });
}, 60_000);
