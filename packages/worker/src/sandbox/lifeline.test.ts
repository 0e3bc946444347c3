import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { AttemptLease, beatLine, underLifeline } from "./lifeline.js";

/** A shell to run the lifeline with: its argv, and the PATH it finds its commands on. */
interface Shell {
  argv: string[];
  path: () => string;
  /** Whether the sentinel makes processes for each beat (`timeout` and `head`), or waits with the shell's `read -t`. */
  forksPerBeat: boolean;
}

/**
 * Runs `script` with sh under a lifeline on fd 3 whose first beat must come within `waitMs`,
 * writing `beats` (seconds left, as the worker does) at their times, then nothing (or closing the
 * pipe at `endAtMs`, as a dead worker's kernel does); its own session and process group. Resolves with how it
 * ended and when (ms after the start), and the processes its session gained between `watch`'s two
 * times (ms after the start).
 */
function underSentinel(
  shell: Shell,
  script: string,
  waitMs: number,
  { beats = [], watch, endAtMs }: { beats?: { atMs: number; msLeft: number }[]; watch?: [number, number]; endAtMs?: number } = {},
): Promise<{ signal: string | null; code: number | null; afterMs: number; gained?: number[] }> {
  const [, , lifelineScript, name, wait, ...argv] = underLifeline(["sh", "-c", script], "fd3", waitMs);
  const [cmd, ...args] = shell.argv as [string, ...string[]];
  const started = performance.now();
  const child = spawn(cmd, [...args, "-c", lifelineScript as string, name as string, wait as string, ...argv], {
    detached: true,
    stdio: ["ignore", "ignore", "ignore", "pipe"],
    env: { PATH: shell.path() },
  });
  const pipe = child.stdio[3] as NodeJS.WritableStream;
  const timers = beats.map(({ atMs, msLeft }) => setTimeout(() => pipe.write(beatLine(msLeft)), atMs));
  let first: number[] = [];
  let gained: number[] | undefined;
  if (watch) {
    timers.push(setTimeout(() => (first = sessionPids(child.pid as number)), watch[0]));
    timers.push(setTimeout(() => (gained = sessionPids(child.pid as number).filter((pid) => !first.includes(pid))), watch[1]));
  }
  if (endAtMs !== undefined) timers.push(setTimeout(() => pipe.end(), endAtMs));
  return new Promise((resolve) =>
    child.on("exit", (code, signal) => {
      for (const t of timers) clearTimeout(t);
      (pipe as unknown as { destroy(): void }).destroy();
      resolve({ code, signal, afterMs: performance.now() - started, gained });
    }),
  );
}

/** The live processes of session `sid` (`timeout` makes its own process group). */
function sessionPids(sid: number): number[] {
  const pids: number[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const [state, , , session] = stat.slice(stat.lastIndexOf(") ") + 2).split(" ");
      if (Number(session) === sid && state !== "Z") pids.push(Number(name));
    } catch {}
  }
  return pids;
}

/** A folder of links to `commands` (name: target) alone, as a PATH: an image that has those and no more. */
function only(commands: Record<string, string>): () => string {
  let dir: string | undefined;
  return () => {
    if (!dir) {
      dir = mkdtempSync(join(tmpdir(), "boxcar-path-"));
      for (const [name, target] of Object.entries(commands)) symlinkSync(target, join(dir, name));
    }
    return dir;
  };
}

const which = (command: string) => execFileSync("sh", ["-c", `command -v ${command}`], { encoding: "utf8" }).trim();

// Each way the sentinel can wait for beats (lifeline.ts, SENTINEL): Debian's dash with bash beside
// it, bash as sh, dash with coreutils' timeout and no bash, and busybox's ash (Alpine-like), where there is one.
const shells: [string, Shell][] = [
  ["dash, bash beside it", { argv: ["/bin/sh"], path: () => "/usr/bin:/bin", forksPerBeat: false }],
  ["bash as sh", { argv: [which("bash")], path: () => "/usr/bin:/bin", forksPerBeat: false }],
  [
    "dash and coreutils' timeout, no bash",
    {
      argv: ["/bin/sh"],
      path: only({ sh: which("dash"), timeout: which("timeout"), head: which("head"), sleep: which("sleep") }),
      forksPerBeat: true,
    },
  ],
];
if (existsSync("/bin/busybox")) {
  const applets = Object.fromEntries(["sh", "timeout", "head", "sleep", "kill"].map((a) => [a, "/bin/busybox"]));
  shells.push(["busybox", { argv: ["/bin/busybox", "sh"], path: only(applets), forksPerBeat: false }]);
}

describe.concurrent.each(shells)("the sentinel (%s)", (_name, shell) => {
  test("with no beat the agent is killed at its first wait, though it and the sentinel ignore SIGTERM", async () => {
    const ended = await underSentinel(shell, "trap '' TERM; sleep 30", 1_000);
    expect(ended.signal).toBe("SIGKILL");
    expect(ended.afterMs).toBeLessThan(10_000);
  });

  test("each beat's time left holds it: beats saying 1 s, every 300 ms, keep a 2 s agent to its end; the sentinel makes a process per beat only where it must", async () => {
    const beats = Array.from({ length: 8 }, (_, i) => ({ atMs: 300 * (i + 1), msLeft: 1_000 }));
    // Watched from between the first and second beats to between the fifth and sixth.
    const ended = await underSentinel(shell, "sleep 2", 1_000, { beats, watch: [450, 1_650] });
    expect(ended).toMatchObject({ code: 0, signal: null });
    if (shell.forksPerBeat) expect(ended.gained?.length).toBeGreaterThan(0);
    else expect(ended.gained, "processes made while beats came").toEqual([]);
  });

  test("a beat giving more time is waited for that long, and no longer", async () => {
    // The first wait is 1 s; a beat at 300 ms says 2.5 s are left: the agent lives past 1 s, and dies by the new time.
    const ended = await underSentinel(shell, "sleep 30", 1_000, { beats: [{ atMs: 300, msLeft: 2_500 }] });
    expect(ended.signal).toBe("SIGKILL");
    expect(ended.afterMs).toBeGreaterThan(1_500);
  });

  test("the pipe's end (the worker gone) kills the agent at once", async () => {
    const ended = await underSentinel(shell, "sleep 30", 20_000, { endAtMs: 300 });
    expect(ended.signal).toBe("SIGKILL");
    expect(ended.afterMs).toBeLessThan(5_000);
  });
});

test("a lease lapses at its stop time unless renewed, and stays lapsed: a renewal confirmed after it counts for nothing", () => {
  const lease = new AttemptLease(30_000, 0);
  expect(lease.stopAfterMs).toBe(25_000);
  const heard: number[] = [];
  lease.onRenewed((msLeft) => heard.push(msLeft));
  lease.renewed(10_000, 10_050);
  expect(heard).toEqual([24_950]);
  expect(lease.lapsed(34_999)).toBe(false);
  // Sent in time, confirmed after the stop time (a worker frozen between): too late.
  lease.renewed(34_000, 36_000);
  expect(lease.lapsed(36_000)).toBe(true);
  lease.renewed(36_500, 36_600);
  expect(lease.lapsed(36_600)).toBe(true);
  expect(heard).toHaveLength(1);
});
