import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { AttemptLease, beatLine, underLifeline } from "./lifeline.js";

/**
 * Runs `script` with sh under a lifeline on fd 3 whose first beat must come within `waitMs`,
 * writing `beats` (seconds left, as the worker does) at their times, then nothing; its own process
 * group. Resolves with how it ended and when (ms after the start).
 */
function underSentinel(
  shell: string[],
  script: string,
  waitMs: number,
  beats: { atMs: number; msLeft: number }[] = [],
): Promise<{ signal: string | null; code: number | null; afterMs: number }> {
  const [, , lifelineScript, name, wait, ...argv] = underLifeline(["sh", "-c", script], "fd3", waitMs);
  const [cmd, ...args] = shell as [string, ...string[]];
  const started = performance.now();
  const child = spawn(cmd, [...args, "-c", lifelineScript as string, name as string, wait as string, ...argv], {
    detached: true,
    stdio: ["ignore", "ignore", "ignore", "pipe"],
    env: { PATH: shell[0] === "/bin/busybox" ? busyboxOnly() : "/usr/bin:/bin" },
  });
  const pipe = child.stdio[3] as NodeJS.WritableStream;
  const timers = beats.map(({ atMs, msLeft }) => setTimeout(() => pipe.write(beatLine(msLeft)), atMs));
  return new Promise((resolve) =>
    child.on("exit", (code, signal) => {
      for (const t of timers) clearTimeout(t);
      (pipe as unknown as { destroy(): void }).destroy();
      resolve({ code, signal, afterMs: performance.now() - started });
    }),
  );
}

let busyboxBin: string | undefined;
/** A PATH of busybox's applets alone (its sh, timeout, head, sleep), as in an image of busybox. */
function busyboxOnly(): string {
  if (!busyboxBin) {
    busyboxBin = mkdtempSync(join(tmpdir(), "boxcar-busybox-"));
    for (const applet of ["sh", "timeout", "head", "sleep", "kill"]) symlinkSync("/bin/busybox", join(busyboxBin, applet));
  }
  return busyboxBin;
}

// Debian's dash with coreutils' timeout, and busybox's sh and timeout (Alpine-like images), where there is one.
const shells: [string, string[]][] = [["dash and coreutils", ["/bin/sh"]]];
if (existsSync("/bin/busybox")) shells.push(["busybox", ["/bin/busybox", "sh"]]);

describe.each(shells)("the sentinel (%s)", (_name, shell) => {
  test("with no beat the agent is killed at its first wait, though it and the sentinel ignore SIGTERM", async () => {
    const ended = await underSentinel(shell, "trap '' TERM; sleep 30", 1_000);
    expect(ended.signal).toBe("SIGKILL");
    expect(ended.afterMs).toBeLessThan(10_000);
  });

  test("each beat's time left holds it: beats saying 1 s, every 300 ms, keep a 2 s agent to its end", async () => {
    const beats = Array.from({ length: 8 }, (_, i) => ({ atMs: 300 * (i + 1), msLeft: 1_000 }));
    expect(await underSentinel(shell, "sleep 2", 1_000, beats)).toMatchObject({ code: 0, signal: null });
  });

  test("a beat giving more time is waited for that long, and no longer", async () => {
    // The first wait is 1 s; a beat at 300 ms says 2.5 s are left: the agent lives past 1 s, and dies by the new time.
    const ended = await underSentinel(shell, "sleep 30", 1_000, [{ atMs: 300, msLeft: 2_500 }]);
    expect(ended.signal).toBe("SIGKILL");
    expect(ended.afterMs).toBeGreaterThan(1_500);
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
