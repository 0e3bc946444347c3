import { readdirSync, readFileSync } from "node:fs";
import { mkdtemp, rm, stat, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BoxcarError, ErrorCode, RuntimeWishes } from "@boxcar/protocol";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { AttemptLease } from "../lifeline.js";
import type { ExecResult, Sandbox } from "../sandbox.js";
import { createHostSandboxProvider } from "./host-sandbox.js";

let root: string;
let sandbox: Sandbox;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "boxcar-host-test-"));
  const provider = createHostSandboxProvider({ root, killGraceMs: 200 });
  sandbox = await provider.create({ id: "sbx-test", jobId: "j1", attempt: 1, workerId: "w1", runtime: RuntimeWishes.parse({}) });
});

afterEach(async () => {
  await sandbox.destroy();
  await rm(root, { recursive: true, force: true });
});

/** Runs `script` with sh, collecting stdout as text. */
async function run(
  script: string,
  opts: { env?: Record<string, string>; signal?: AbortSignal; onStdout?: (text: string) => void; attemptLease?: AttemptLease } = {},
) {
  let stdout = "";
  const result: ExecResult = await sandbox.exec(["sh", "-c", script], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...opts.env },
    signal: opts.signal ?? new AbortController().signal,
    ...(opts.attemptLease ? { attemptLease: opts.attemptLease } : {}),
    onOutput: (stream, chunk) => {
      if (stream !== "stdout") return;
      stdout += Buffer.from(chunk).toString();
      opts.onStdout?.(stdout);
    },
  });
  return { result, stdout };
}

/** True while `pid` is a live process (a zombie waiting to be reaped counts as gone). */
function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.[0] !== "Z";
  } catch {
    return false;
  }
}

/** Waits until `pid` is gone: a killed process closes its pipes a moment before it is marked dead. */
async function waitGone(pid: number, ms = 5_000): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (isAlive(pid)) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
}

async function rejection(promise: Promise<unknown>): Promise<BoxcarError> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(BoxcarError);
  return err as BoxcarError;
}

describe("host sandbox", () => {
  test("the workspace is private, and the command runs in it", async () => {
    expect((await stat(sandbox.workspace)).mode & 0o777).toBe(0o700);
    const { result, stdout } = await run("pwd");
    expect(result).toMatchObject({ exitCode: 0, signal: null, aborted: false });
    expect(stdout.trim()).toBe(sandbox.workspace);
  });

  test("the command sees exactly the environment it is given, nothing of the worker's", async () => {
    process.env.BOXCAR_HOST_TEST_LEAK = "worker-only";
    try {
      const { stdout } = await run("env", { env: { GIVEN: "yes" } });
      expect(stdout).toContain("GIVEN=yes");
      expect(stdout).not.toContain("BOXCAR_HOST_TEST_LEAK");
      expect(stdout).not.toContain("worker-only");
    } finally {
      delete process.env.BOXCAR_HOST_TEST_LEAK;
    }
  });

  test("abort kills the whole process tree, grandchildren included", async () => {
    const abort = new AbortController();
    let grandchild = 0;
    const { result } = await run("sleep 300 & echo $!; wait", {
      signal: abort.signal,
      onStdout: (text) => {
        grandchild = Number.parseInt(text, 10);
        abort.abort();
      },
    });
    expect(result.aborted).toBe(true);
    expect(result.exitCode).toBeNull();
    expect(grandchild).toBeGreaterThan(0);
    expect(await waitGone(grandchild)).toBe(true);
  });

  test("a lease renewed in time keeps the agent; one left unconfirmed past its stop time takes its whole tree down, though nothing aborts it", async () => {
    // A 1.2 s lease: the agent must be stopped 1 s after the last confirmed renewal.
    const kept = new AttemptLease(1_200);
    const renewing = setInterval(() => kept.renewed(performance.now()), 300);
    const alive = await run("sleep 2; echo done", { attemptLease: kept }).finally(() => clearInterval(renewing));
    expect(alive).toMatchObject({ result: { exitCode: 0, aborted: false }, stdout: "done\n" });

    let grandchild = 0;
    const lapsing = new AttemptLease(1_200);
    const { result } = await run("(trap '' TERM; sleep 300) & echo $!; sleep 300", {
      attemptLease: lapsing,
      onStdout: (text) => {
        grandchild = Number.parseInt(text, 10);
      },
    });
    expect(result).toMatchObject({ exitCode: null, signal: "SIGKILL", aborted: false });
    expect(await waitGone(grandchild)).toBe(true);
  });

  test("an abort that comes while the command is being started stops it too (it does not run on unheard)", async () => {
    const abort = new AbortController();
    const running = sandbox.exec(["sleep", "30"], {
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      signal: abort.signal,
      onOutput: () => {},
    });
    abort.abort(); // the exec is still looking the command up
    expect(await running).toMatchObject({ aborted: true, exitCode: null });
  });

  test("processes the command leaves behind end with it", async () => {
    const { result, stdout } = await run("sleep 300 & echo $!");
    expect(result).toMatchObject({ exitCode: 0, aborted: false });
    expect(await waitGone(Number.parseInt(stdout, 10))).toBe(true);
  });

  test("a command that does not exist is an agent failure", async () => {
    const err = await rejection(
      sandbox.exec(["no-such-command-boxcar"], { env: {}, signal: new AbortController().signal, onOutput: () => {} }),
    );
    expect(err.code).toBe(ErrorCode.agentFailed);
  });

  test("files round-trip; listFiles lists regular files only and follows no symlinks", async () => {
    await sandbox.writeFile("a/b/c.txt", new TextEncoder().encode("hello"));
    await sandbox.writeFile("s.bin", new Blob([new Uint8Array([1, 2, 3])]).stream());
    await sandbox.mkdir("empty/dir");
    await symlink("/etc", join(sandbox.workspace, "etc-link"));
    const body = await sandbox.readFile("a/b/c.txt");
    expect(await new Response(body).text()).toBe("hello");
    expect(await sandbox.readFile("missing.txt")).toBeNull();
    expect(await sandbox.readFile("a")).toBeNull();
    const files = await sandbox.listFiles();
    expect(files.sort((x, y) => x.path.localeCompare(y.path))).toEqual([
      { path: "a/b/c.txt", size: 5 },
      { path: "s.bin", size: 3 },
    ]);
  });

  test("paths that leave the workspace are rejected", async () => {
    const outside = await mkdtemp(join(tmpdir(), "boxcar-outside-"));
    try {
      await writeFile(join(outside, "secret.txt"), "outside");
      await symlink(outside, join(sandbox.workspace, "dir-link"));
      await symlink(join(outside, "secret.txt"), join(sandbox.workspace, "file-link"));
      const data = new TextEncoder().encode("x");
      for (const attempt of [
        () => sandbox.writeFile("../escape.txt", data),
        () => sandbox.writeFile("/tmp/escape.txt", data),
        () => sandbox.writeFile("a/../../escape.txt", data),
        () => sandbox.writeFile("dir-link/escape.txt", data),
        () => sandbox.writeFile("file-link", data),
        () => sandbox.readFile("dir-link/secret.txt"),
        () => sandbox.readFile("file-link"),
        () => sandbox.mkdir("dir-link/sub"),
      ]) {
        expect((await rejection(attempt())).code).toBe(ErrorCode.invalid);
      }
      expect(readFileSync(join(outside, "secret.txt"), "utf8")).toBe("outside");
      expect(readdirSync(outside)).toEqual(["secret.txt"]);
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });

  test("destroy removes the workspace and kills what still runs; a second call is fine", async () => {
    let grandchild = 0;
    const abort = new AbortController();
    const running = run("sleep 300 & echo $!; wait", {
      signal: abort.signal,
      onStdout: (text) => {
        grandchild = Number.parseInt(text, 10);
        void sandbox.destroy();
      },
    });
    const { result } = await running;
    expect(result.signal).toBe("SIGKILL");
    expect(await waitGone(grandchild)).toBe(true);
    await sandbox.destroy();
    await expect(stat(sandbox.workspace)).rejects.toMatchObject({ code: "ENOENT" });
  });
});

describe.skipIf(process.getuid?.() !== 0)("as another user (a worker running as root)", () => {
  test("the agent cannot read the worker's environment through /proc, and still owns its workspace", async () => {
    // The attack of issue 11: a host agent read /proc/$PPID/environ and found other agents' secrets.
    const asWorker = await run("cat /proc/$PPID/environ >/dev/null && echo read || echo refused");
    expect(asWorker.stdout).toBe("read\n");

    const other = await createHostSandboxProvider({ root, killGraceMs: 200, user: { uid: 65534, gid: 65534 } }).create({
      id: "sbx-nobody",
      jobId: "j2",
      attempt: 1,
      workerId: "w1",
      runtime: RuntimeWishes.parse({}),
    });
    try {
      await other.writeFile("in/input.txt", new TextEncoder().encode("for the agent"));
      let stdout = "";
      const result = await other.exec(
        ["sh", "-c", "id -u; cat /proc/$PPID/environ >/dev/null 2>&1 && echo read || echo refused; cat in/input.txt; echo made > out.txt"],
        {
          env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
          signal: new AbortController().signal,
          onOutput: (stream, chunk) => {
            if (stream === "stdout") stdout += Buffer.from(chunk).toString();
          },
        },
      );
      expect(result.exitCode).toBe(0);
      expect(stdout).toBe("65534\nrefused\nfor the agent");
      const out = await other.readFile("out.txt");
      expect(out && (await new Response(out).text())).toBe("made\n");
    } finally {
      await other.destroy();
    }
  });
});
