/**
 * A terminal a test uses as a person would: a `tmux` server of its own (its own socket, no user
 * configuration, no status line), one window of a given size running a command, keys typed into
 * it, and its screen read back (`capture-pane`).
 */

import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { eventually } from "@boxcar/testing";

const run = promisify(execFile);

/** Whether `tmux` is on this machine's PATH (`scripts/test.sh` installs it); with `BOXCAR_REQUIRE_TMUX` set (CI), its absence fails. */
export async function tmuxReady(): Promise<boolean> {
  const found = await run("tmux", ["-V"]).then(
    () => true,
    () => false,
  );
  if (!found && process.env.BOXCAR_REQUIRE_TMUX) throw new Error("BOXCAR_REQUIRE_TMUX is set but no tmux was found: install Debian's tmux");
  return found;
}

export interface TmuxTerminal extends AsyncDisposable {
  /** Types `text` as it is (no Enter). */
  type(text: string): Promise<void>;
  /** Presses keys by tmux's names: `Enter`, `C-c`, `C-d`. */
  press(...keys: string[]): Promise<void>;
  /** What the window shows now, line by line (a line wrapped at its edge joined again; trailing blanks trimmed). */
  screen(): Promise<string>;
  /** Waits (up to 30 s) until the screen matches `pattern`; returns the screen. */
  waitFor(pattern: RegExp, what: string): Promise<string>;
  /** Makes the window `cols` by `rows`, as a person dragging its corner. */
  resize(cols: number, rows: number): Promise<void>;
}

/**
 * Runs `argv` (with `env` added) in a new tmux window of `cols` by `rows`. When it exits the window
 * stays, showing `[exited CODE]`, so its exit code is read off the screen.
 */
export async function tmuxTerminal(
  argv: readonly string[],
  env: Record<string, string>,
  size: { cols: number; rows: number },
): Promise<TmuxTerminal> {
  const dir = await mkdtemp(join(tmpdir(), "boxcar-tmux-"));
  const socket = join(dir, "socket");
  const config = join(dir, "tmux.conf");
  await writeFile(config, "set -g status off\nset -g escape-time 0\n");
  const tmux = (...args: string[]) => run("tmux", ["-S", socket, "-f", config, ...args], { env: { ...process.env, ...env } });
  const quote = (word: string) => `'${word.replaceAll("'", `'\\''`)}'`;
  const exports = Object.entries(env).map(([name, value]) => `${name}=${quote(value)}`);
  const line = `env ${exports.join(" ")} ${argv.map(quote).join(" ")}; echo "[exited $?]"; sleep 3600`;
  const target = `w${randomBytes(4).toString("hex")}`;
  await tmux("new-session", "-d", "-s", target, "-x", String(size.cols), "-y", String(size.rows), line);
  const screen = async () =>
    (await tmux("capture-pane", "-p", "-J", "-t", target)).stdout
      .split("\n")
      .map((l) => l.trimEnd())
      .join("\n")
      .trimEnd();
  return {
    type: async (text) => {
      await tmux("send-keys", "-t", target, "-l", text);
    },
    press: async (...keys) => {
      await tmux("send-keys", "-t", target, ...keys);
    },
    screen,
    waitFor: (pattern, what) =>
      eventually(
        async () => {
          const now = await screen();
          return pattern.test(now) ? now : undefined;
        },
        `the terminal to show ${what}`,
        30_000,
      ).catch(async (err: Error) => {
        throw new Error(`${err.message}; it shows:\n${await screen()}`);
      }),
    resize: async (cols, rows) => {
      await tmux("resize-window", "-t", target, "-x", String(cols), "-y", String(rows));
    },
    [Symbol.asyncDispose]: async () => {
      await tmux("kill-server").catch(() => {});
      await rm(dir, { recursive: true, force: true });
    },
  };
}
