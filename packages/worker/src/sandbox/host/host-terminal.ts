/**
 * A process on a pseudo-terminal of the worker's machine, for a host session's shell
 * (docs/sessions.md#shell). Node.js has no pseudo-terminal of its own, so util-linux's `script`
 * makes one (`script -qfec CMD /dev/null`: it starts CMD through `/bin/sh -c` on a new terminal,
 * in a session of its own, relays its stdin to the terminal and the terminal to its stdout, and
 * exits with CMD's code). CMD sets the window's size (`stty rows R cols C`) before it `exec`s
 * what was asked; a resize is `stty -F` on the terminal `script` holds open (read from
 * `/proc/PID/fd`), which tells what runs on it (SIGWINCH). A Docker session's helper does the
 * same inside its container (helper/session-helper.cjs).
 */

import { execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { readdir, readFile, readlink } from "node:fs/promises";
import { Duplex } from "node:stream";
import { promisify } from "node:util";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { signalGroup } from "../process-group.js";
import type { ExecResult, Terminal, TerminalOptions } from "../sandbox.js";
import { shellQuote } from "../shell-word.js";

/** The shell a terminal runs when none is asked: bash where there is one, else sh. */
export function defaultShell(exists: (path: string) => boolean = existsSync): string {
  return ["/bin/bash", "/usr/bin/bash"].find(exists) ?? "/bin/sh";
}

/**
 * The `sh -c` line `script` runs: the window's size, `SHELL` as the caller's environment says (or
 * the shell), then `argv` in its place.
 */
export function terminalLine(argv: readonly string[], opts: { cols: number; rows: number; shell: string }): string {
  const { cols, rows, shell } = opts;
  return `stty rows ${rows} cols ${cols} 2>/dev/null; SHELL=${shellQuote(shell)}; export SHELL; exec ${argv.map(shellQuote).join(" ")}`;
}

/** Starts `argv` on a new pseudo-terminal in `cwd`, as `user` if given. */
export async function openHostTerminal(
  argv: readonly string[] | undefined,
  opts: TerminalOptions & { cwd: string; user?: { uid: number; gid: number } | undefined; killGraceMs: number },
): Promise<Terminal & { readonly pids: number[] }> {
  const shell = defaultShell();
  const line = terminalLine(argv ?? [shell], { cols: opts.cols, rows: opts.rows, shell: opts.env.SHELL ?? shell });
  const child = spawn("script", ["-qfec", line, "/dev/null"], {
    cwd: opts.cwd,
    // `script` runs the line with $SHELL: sh, whatever the caller's SHELL is (the line sets that one).
    env: { ...opts.env, SHELL: "/bin/sh" },
    detached: true,
    stdio: ["pipe", "pipe", "pipe"],
    ...(opts.user ? { uid: opts.user.uid, gid: opts.user.gid } : {}),
  });
  const startedAt = performance.now();
  await new Promise<void>((resolve, reject) => {
    child.once("spawn", resolve);
    child.once("error", (err: NodeJS.ErrnoException) =>
      reject(
        new BoxcarError(
          ErrorCode.invalid,
          err.code === "ENOENT"
            ? "a terminal needs util-linux's `script` on the worker's PATH (Debian's bsdutils), and there is none"
            : `cannot start a terminal: ${err.message}`,
        ),
      ),
    );
  });
  const pid = child.pid as number;
  child.stdin.on("error", () => {});
  child.stderr.resume(); // `script -q` says nothing there; what it might is no terminal's
  const io = Duplex.from({ readable: child.stdout, writable: child.stdin });
  io.on("error", () => {});
  /** The shell's process group (its session's, `script` made it), once known. */
  let shellPid: number | undefined;
  const pids = [pid];
  void childOf(pid).then((found) => {
    if (found === undefined) return;
    shellPid = found;
    pids.push(found);
  });
  let killed = false;
  const timers: NodeJS.Timeout[] = [];
  const exited = new Promise<ExecResult>((resolve) => {
    child.once("close", (exitCode: number | null, signal: NodeJS.Signals | null) => {
      for (const timer of timers) clearTimeout(timer);
      resolve({ exitCode, signal, aborted: killed, durationMs: performance.now() - startedAt });
    });
  });
  return {
    io,
    pids,
    exited,
    resize: coalesced(async (cols, rows) => {
      const tty = await terminalOf(pid);
      if (tty) await promisify(execFile)("stty", ["-F", tty, "rows", String(rows), "cols", String(cols)]).catch(() => {});
    }),
    kill: () => {
      if (killed) return;
      killed = true;
      // A hangup, as a terminal that closes gives; `script` ends once what ran on it has.
      const shellGroup = shellPid;
      if (shellGroup !== undefined) signalGroup(shellGroup, "SIGHUP");
      signalGroup(pid, "SIGTERM");
      timers.push(
        setTimeout(() => {
          if (shellGroup !== undefined) signalGroup(shellGroup, "SIGKILL");
          signalGroup(pid, "SIGKILL");
        }, opts.killGraceMs),
      );
    },
  };
}

/** A resize that runs one at a time, the last size asked winning over those that waited. */
export function coalesced(apply: (cols: number, rows: number) => Promise<void>): (cols: number, rows: number) => void {
  let wanted: [number, number] | undefined;
  let busy = false;
  return (cols, rows) => {
    wanted = [cols, rows];
    if (busy) return;
    busy = true;
    void (async () => {
      while (wanted) {
        const [c, r] = wanted;
        wanted = undefined;
        await apply(c, r).catch(() => {});
      }
      busy = false;
    })();
  };
}

/** The terminal (`/dev/pts/N`) process `pid` holds open: `script` keeps its terminal's other end. */
async function terminalOf(pid: number): Promise<string | undefined> {
  const dir = `/proc/${pid}/fd`;
  for (const fd of await readdir(dir).catch(() => [])) {
    const target = await readlink(`${dir}/${fd}`).catch(() => "");
    if (/^\/dev\/pts\/\d+$/.test(target)) return target;
  }
  return undefined;
}

/** The first child of `pid` (the shell `script` started), looked for a little while it starts. */
async function childOf(pid: number): Promise<number | undefined> {
  for (let tries = 0; tries < 50; tries++) {
    const children = await readFile(`/proc/${pid}/task/${pid}/children`, "utf8").catch(() => undefined);
    if (children === undefined) return undefined;
    const first = Number(children.trim().split(/\s+/)[0]);
    if (Number.isInteger(first) && first > 0) return first;
    await new Promise((r) => setTimeout(r, 20));
  }
  return undefined;
}
