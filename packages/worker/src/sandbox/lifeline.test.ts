import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Docker from "dockerode";
import { describe, expect, test } from "vitest";
import { AttemptLease, beatLine, underLifeline } from "./lifeline.js";

/** A shell to run the lifeline with: its argv, and the PATH it finds its commands on. */
interface Shell {
  argv: string[];
  path: () => string;
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
  {
    beats = [],
    watch,
    endAtMs,
    signalsAtMs,
    env = {},
  }: {
    beats?: { atMs: number; msLeft: number }[];
    watch?: [number, number];
    endAtMs?: number;
    /** Signals sent to the whole group then, as an agent may (`kill -USR1 0`). */
    signalsAtMs?: [number, NodeJS.Signals[]];
    /** The agent's environment, over the shell's PATH. */
    env?: NodeJS.ProcessEnv;
  } = {},
): Promise<{ signal: string | null; code: number | null; afterMs: number; gained?: number[] }> {
  const [, , lifelineScript, name, wait, ...argv] = underLifeline(["sh", "-c", script], "fd3", waitMs);
  const [cmd, ...args] = shell.argv as [string, ...string[]];
  const started = performance.now();
  const child = spawn(cmd, [...args, "-c", lifelineScript as string, name as string, wait as string, ...argv], {
    detached: true,
    stdio: ["ignore", "ignore", "ignore", "pipe"],
    env: { PATH: shell.path(), ...env },
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
  if (signalsAtMs) {
    const [atMs, signals] = signalsAtMs;
    timers.push(
      setTimeout(() => {
        for (const signal of signals) process.kill(-(child.pid as number), signal);
      }, atMs),
    );
  }
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

// The shells the sentinel waits for beats with, fork-free (lifeline.ts, SENTINEL): Debian's dash
// with bash beside it, bash as sh, and busybox's ash (Alpine-like), where there is one. (An image
// without bash or busybox, where it forks `timeout` for each beat, is tried in Docker:
// test/one-attempt.test.ts.)
const shells: [string, Shell][] = [
  ["dash, bash beside it", { argv: ["/bin/sh"], path: () => "/usr/bin:/bin" }],
  ["bash as sh", { argv: [which("bash")], path: () => "/usr/bin:/bin" }],
];
if (existsSync("/bin/busybox")) {
  const applets = Object.fromEntries(["sh", "timeout", "head", "sleep", "kill"].map((a) => [a, "/bin/busybox"]));
  shells.push(["busybox", { argv: ["/bin/busybox", "sh"], path: only(applets) }]);
}

/** The signals an agent may send its own group that it ignores itself: none may end the sentinel. */
const GROUP_SIGNALS: NodeJS.Signals[] = ["SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE", "SIGTSTP"];
const IGNORING = `trap '' TERM HUP INT QUIT USR1 USR2 ALRM PIPE TSTP`;

describe.concurrent.each(shells)("the sentinel (%s)", (_name, shell) => {
  test("with no beat the agent is killed at its first wait, though the agent signals its whole group (TERM, USR1, ALRM...) meanwhile", async () => {
    const ended = await underSentinel(shell, `${IGNORING}; sleep 30`, 1_000, { signalsAtMs: [300, GROUP_SIGNALS] });
    expect(ended.signal).toBe("SIGKILL");
    expect(ended.afterMs).toBeLessThan(3_000);
  });

  test("each beat's time left holds it: beats saying 1 s, every 300 ms, keep a 2 s agent to its end, and the sentinel makes no process for them", async () => {
    const beats = Array.from({ length: 8 }, (_, i) => ({ atMs: 300 * (i + 1), msLeft: 1_000 }));
    // Watched from between the first and second beats to between the fifth and sixth.
    const ended = await underSentinel(shell, "sleep 2", 1_000, { beats, watch: [450, 1_650] });
    expect(ended).toMatchObject({ code: 0, signal: null });
    expect(ended.gained, "processes made while beats came").toEqual([]);
  });

  test("an agent's SIGALRM to its group while beats come does not cut the wait short, in POSIX mode too", async () => {
    const beats = Array.from({ length: 6 }, (_, i) => ({ atMs: 300 * (i + 1), msLeft: 1_000 }));
    const ended = await underSentinel(shell, "trap '' ALRM; sleep 1.5", 1_000, {
      beats,
      signalsAtMs: [500, ["SIGALRM"]],
      env: { POSIXLY_CORRECT: "1" },
    });
    expect(ended).toMatchObject({ code: 0, signal: null });
  });

  test("a beat giving more time is waited for that long, and no longer", async () => {
    // The first wait is 1 s; a beat at 300 ms says 2.5 s are left: the agent lives past 1 s, and dies by the new time.
    const ended = await underSentinel(shell, "sleep 30", 1_000, { beats: [{ atMs: 300, msLeft: 2_500 }] });
    expect(ended.signal).toBe("SIGKILL");
    expect(ended.afterMs).toBeGreaterThan(1_500);
    expect(ended.afterMs).toBeLessThan(4_500);
  });

  test("the pipe's end (the worker gone) kills the agent at once", async () => {
    const ended = await underSentinel(shell, "sleep 30", 20_000, { endAtMs: 300 });
    expect(ended.signal).toBe("SIGKILL");
    expect(ended.afterMs).toBeLessThan(5_000);
  });

  test("the agent's environment does not take the stop time away: job control asked for (SHELLOPTS), a PATH without the tools, a `bash` that is not bash, a ~/.bashrc of the workspace's", async () => {
    const bare = only({ sh: which("sh"), sleep: which("sleep") })();
    const fake = only({ sh: which("sh"), sleep: which("sleep"), bash: "/usr/bin/true", timeout: "/usr/bin/true" })();
    // The host's lifeline is a socket, on which Debian's bash reads ~/.bashrc (HOME is the workspace).
    const home = mkdtempSync(join(tmpdir(), "boxcar-home-"));
    writeFileSync(join(home, ".bashrc"), "exec sleep 100\n");
    const environments = [
      { SHELLOPTS: "monitor" },
      { PATH: bare },
      { PATH: fake },
      { PATH: fake, IFS: "1" },
      { HOME: home },
      { POSIXLY_CORRECT: "1", TMOUT: "1" },
    ];
    for (const env of environments) {
      const ended = await underSentinel(shell, "sleep 30", 1_000, { env });
      expect(ended.signal, JSON.stringify(env)).toBe("SIGKILL");
      expect(ended.afterMs, JSON.stringify(env)).toBeLessThan(3_000);
    }
  });
});

/** The image the Docker sandbox runs agents in by default (scripts/build-images.sh makes it). */
const AGENT_IMAGE = process.env.BOXCAR_AGENT_IMAGE ?? "boxcar-agent:latest";
const dockerUp = await new Docker()
  .getImage(AGENT_IMAGE)
  .inspect()
  .then(
    () => true,
    () => false,
  );
if (!dockerUp && process.env.BOXCAR_REQUIRE_DOCKER)
  throw new Error(`BOXCAR_REQUIRE_DOCKER is set, but no Docker engine has ${AGENT_IMAGE}`);

describe.skipIf(!dockerUp)("the sentinel where it must fork for each beat (a container of dash and coreutils, no bash)", () => {
  test("attack: an agent that forks without pause at its pids limit is stopped by its stop time, never left running", async () => {
    const docker = new Docker();
    const container = await docker.createContainer({
      Image: AGENT_IMAGE,
      Entrypoint: [],
      // Forks without pause: each process freed (the sentinel's own, as a beat ends) is taken at once.
      Cmd: underLifeline(["perl", "-e", "while (1) { my $p = fork; if (defined $p && $p == 0) { sleep 300; exit } }"], "stdin", 2_000),
      AttachStdin: true,
      AttachStdout: true,
      AttachStderr: true,
      OpenStdin: true,
      StdinOnce: true,
      // No bash: /dev/null, not executable, in its place.
      HostConfig: { Init: true, PidsLimit: 16, Binds: ["/dev/null:/usr/bin/bash:ro"] },
    });
    try {
      const lifeline = await container.attach({ stream: true, stdin: true, stdout: true, stderr: true, hijack: true });
      await container.start();
      // Beats saying 2 s are left, for 3 s; then none, as from a frozen worker. Meanwhile its
      // processes show which way the sentinel waits: `timeout`, never bash (unless a refused fork
      // ended it, and the group, first).
      const beating = setInterval(() => lifeline.write(beatLine(2_000)), 500);
      const seen = new Set<string>();
      for (const until = Date.now() + 3_000; Date.now() < until; ) {
        const top: { Processes?: string[][] } | undefined = await container.top().catch(() => undefined);
        for (const p of top?.Processes ?? []) seen.add((p.at(-1) ?? "").split(" ")[0] as string);
        await new Promise((r) => setTimeout(r, 100));
      }
      clearInterval(beating);
      const lastBeat = Date.now();
      expect([...seen].filter((command) => command.endsWith("bash"))).toEqual([]);
      let running = (await container.inspect()).State.Running;
      if (running) expect(seen.has("timeout")).toBe(true);
      while (running && Date.now() < lastBeat + 2_000 + 1_500) {
        await new Promise((r) => setTimeout(r, 100));
        running = (await container.inspect()).State.Running;
      }
      expect(running, "the agent's container past its stop time").toBe(false);
    } finally {
      await container.remove({ force: true });
    }
  }, 30_000);
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
