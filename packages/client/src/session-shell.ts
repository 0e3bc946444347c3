/**
 * A shell on a terminal in a session, from here (docs/sessions.md#shell): `sessions.shell` starts
 * it, and its terminal's bytes go through a tunnel of the caller's own, as a port's do; a resize is
 * a `Boxcar-Resize` message on it, and its end says how the shell exited (`Boxcar-Exit`).
 */

import type { Duplex } from "node:stream";
import { TunnelHeader } from "@boxcar/common";
import { ApiEndpoint, BoxcarError, ErrorCode, type ProcessInfo } from "@boxcar/protocol";
import type { DispatcherApi } from "./dispatcher-api.js";
import { newTunnel, openTunnel } from "./session-ports.js";

/** How a session's shell ended: its exit code, or the signal that ended it. */
export interface ShellExit {
  exitCode: number | null;
  signal: string | null;
}

export interface ShellOptions {
  /** The terminal's size, in characters. */
  cols: number;
  rows: number;
  /** What runs on it; default: the session's `bash`, else `/bin/sh`. */
  argv?: string[];
  /** Added to the session's environment. */
  env?: Record<string, string>;
  /** A folder of the workspace to start in. */
  cwd?: string;
  /** `TERM` for what runs on it; default `xterm-256color`. */
  term?: string;
  /** How long it may run (`"8h"`, or ms); default 8 hours. */
  timeout?: string | number;
}

/** A shell running on a terminal in a session. */
export interface SessionShell {
  /** Its process in the session's background (`sessions.processes` lists it; `killInSession` hangs it up). */
  readonly process: ProcessInfo;
  /** The terminal's bytes: write keys to it (`\x03` is Ctrl-C, `\x04` Ctrl-D), read what it shows. */
  readonly stream: Duplex;
  /** The terminal is `cols` by `rows` now: what runs on it hears SIGWINCH. */
  resize(cols: number, rows: number): void;
  /**
   * Resolves once it exited and all it showed was read from `stream`; rejects when its tunnel ended
   * first (the session closed: `tunnel_reset`, saying so; the worker went silent).
   */
  readonly exited: Promise<ShellExit>;
  /** Hangs up (the shell gets SIGHUP). Safe to call twice. */
  close(): void;
}

export async function openShell(api: DispatcherApi, id: string, opts: ShellOptions): Promise<SessionShell> {
  const { tunnel, stream } = newTunnel(api, [TunnelHeader.exit]);
  let exit: ShellExit | undefined;
  stream.on("control", (fields: Record<string, string>) => {
    const said = fields[TunnelHeader.exit] ?? "";
    exit = /^\d+$/.test(said) ? { exitCode: Number(said), signal: null } : { exitCode: null, signal: said || null };
  });
  const exited = new Promise<ShellExit>((resolve, reject) => {
    stream.once("end", () => {
      // Its side is done: this one too (nothing more goes to a shell that ended).
      stream.end();
      if (exit) resolve(exit);
      else reject(new BoxcarError(ErrorCode.unavailable, "the shell's tunnel ended without saying how the shell exited"));
    });
    stream.once("error", (err) => {
      if (exit) resolve(exit);
      else reject(err);
    });
    stream.once("close", () => {
      if (!exit) reject(new BoxcarError(ErrorCode.unavailable, "the shell's tunnel closed before the shell exited"));
    });
  });
  exited.catch(() => {});
  const reply = await openTunnel(
    stream,
    () =>
      api.request(ApiEndpoint.sessionsShell, {
        id,
        tunnel,
        cols: opts.cols,
        rows: opts.rows,
        ...(opts.argv ? { argv: opts.argv } : {}),
        ...(opts.env ? { env: opts.env } : {}),
        ...(opts.cwd !== undefined ? { cwd: opts.cwd } : {}),
        ...(opts.term !== undefined ? { term: opts.term } : {}),
        ...(opts.timeout !== undefined ? { timeout: opts.timeout } : {}),
      }),
    () => exit !== undefined,
  );
  return {
    process: reply.process,
    stream,
    exited,
    resize: (cols, rows) => {
      if (!stream.destroyed && stream.writable) stream.control({ [TunnelHeader.resize]: `${Math.trunc(cols)}x${Math.trunc(rows)}` });
    },
    close: () => stream.destroy(),
  };
}
