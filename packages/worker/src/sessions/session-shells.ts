/**
 * A session's shells (docs/sessions.md#shell): `sessions.shell` starts a shell (or a command) on a
 * pseudo-terminal in the session (its sandbox's `openTerminal`), as a process of its background
 * (bounded, listed, killed when the session closes), and relays the terminal's bytes over a
 * tunnel of the caller's, as a port's are (common's `TunnelStream` on
 * `<prefix>.tunnel.<user>.<tunnel>.in|out`, which only that user and admins may use). The caller's
 * `Boxcar-Resize` messages change the window's size; the tunnel's end carries how it exited
 * (`Boxcar-Exit`). A caller that goes (its tunnel reset, or silent) hangs the shell up.
 */

import { TunnelHeader, TunnelStream } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { nowIso } from "@boxcar/fabric/internal";
import {
  BoxcarError,
  ErrorCode,
  type ExecReply,
  parseWith,
  type SessionEvent,
  type ShellReply,
  TUNNEL_CHUNK,
  TUNNEL_WINDOW,
  TunnelWay,
  WorkerShell,
} from "@boxcar/protocol";
import type { ExecResult, Terminal } from "../sandbox/sandbox.js";
import { workspaceCwd } from "../workspace/workspace-path.js";
import type { KeptOutput } from "./background-processes.js";
import type { HeldSession } from "./held-session.js";
import { commandEnv } from "./session-commands.js";

/** How long a shell's tunnel waits, once it said the exit, for the caller to end its side before it is closed. */
const END_WAIT_MS = 5_000;

/** What the session host lends the shell requests. */
export interface ShellHost {
  holding(id: string): HeldSession;
  topology(): Pick<Topology, "nc" | "names">;
  event(held: HeldSession, type: SessionEvent["type"], extra?: Partial<SessionEvent>): Promise<void>;
  save(held: HeldSession): Promise<void>;
  /** Its idle clock may start again (a process ended). */
  idle(held: HeldSession): void;
  /** Bytes went through (the session is in use). */
  traffic(held: HeldSession): void;
}

/** The shell requests, by the last token of their subject. */
export function shellRequests(host: ShellHost): Record<string, (body: unknown) => Promise<unknown>> {
  return { shell: (body) => openShell(host, body) };
}

/** A shell's output goes through its tunnel only: nothing is published or kept. */
const NO_OUTPUT: KeptOutput = {
  end: async () => undefined,
  tails: {
    stdout: { base64: () => "", truncated: false },
    stderr: { base64: () => "", truncated: false },
  },
};

async function openShell(host: ShellHost, body: unknown): Promise<ShellReply> {
  const request = parseWith(WorkerShell, body, "request");
  const held = host.holding(request.id);
  const { sandbox } = held;
  if (!sandbox.openTerminal) {
    throw new BoxcarError(
      ErrorCode.invalid,
      `a shell on a terminal is built for Docker and host sessions, not yet for ${sandbox.kind} ones (session ${request.id})`,
    );
  }
  // Refused before anything runs: a folder out of the workspace, no room for a process or a tunnel.
  const cwd = request.cwd === undefined ? undefined : workspaceCwd(request.cwd);
  held.background.checkRoom();
  held.tunnels.checkRoom(request.user, request.tunnel);
  const { nc, names } = host.topology();
  const tunnel = {
    tunnel: request.tunnel,
    in: names.subjects.tunnel(request.user, request.tunnel, TunnelWay.in),
    out: names.subjects.tunnel(request.user, request.tunnel, TunnelWay.out),
    window: TUNNEL_WINDOW,
    openedAt: nowIso(),
  };
  // Listening on `in` before the reply goes: the caller sends once it has it.
  const stream = new TunnelStream(nc, {
    send: tunnel.out,
    receive: tunnel.in,
    windowBytes: TUNNEL_WINDOW,
    chunkBytes: TUNNEL_CHUNK,
    onTraffic: () => host.traffic(held),
    controls: [TunnelHeader.resize],
  });
  stream.on("error", () => {}); // its end is heard below; the caller is told by the tunnel itself
  const env = { ...commandEnv(held, request), TERM: request.term };
  let terminal: Terminal;
  try {
    terminal = await sandbox.openTerminal(request.argv, {
      env,
      cols: request.cols,
      rows: request.rows,
      ...(cwd !== undefined ? { cwd } : {}),
    });
  } catch (err) {
    stream.destroy();
    throw err;
  }
  const execId = `${request.id}.${held.record.execs + 1}`;
  let process: ReturnType<HeldSession["background"]["start"]>;
  try {
    held.tunnels.adopt(request.user, request.tunnel, stream);
    process = held.background.start(execId, request.argv ?? ["(shell)"], {
      output: NO_OUTPUT,
      timeoutMs: request.timeout,
      terminal: true,
      run: (signal) => {
        signal.addEventListener("abort", () => terminal.kill(), { once: true });
        if (signal.aborted) terminal.kill();
        return terminal.exited;
      },
      ended: (reply: ExecReply) => {
        void host.event(held, "exec_exited", { execId, exitCode: reply.exitCode, signal: reply.signal, durationMs: reply.durationMs });
        host.idle(held);
      },
    });
  } catch (err) {
    terminal.kill();
    stream.destroy();
    throw err;
  }
  held.record = { ...held.record, execs: held.record.execs + 1, lastUsedAt: nowIso() };
  relay(stream, terminal, () => {
    // The caller went (reset, silence) or the session closes: the shell is hung up.
    if (held.background.list().some((p) => p.execId === execId && p.running)) held.background.kill(execId);
  });
  stream.open();
  await Promise.all([host.event(held, "exec_started", { execId }), host.save(held)]);
  return { process, tunnel };
}

/**
 * Relays a terminal's bytes through its tunnel: keys in (the caller's end of its side does not end
 * them: Ctrl-D does), the screen out; a resize heard is the terminal's; once it exited and its
 * last bytes went, the tunnel ends saying how. `gone`: the tunnel closed first.
 */
function relay(stream: TunnelStream, terminal: Terminal, gone: () => void): void {
  const { io } = terminal;
  let exited = false;
  stream.pipe(io, { end: false });
  io.pipe(stream, { end: false });
  stream.on("control", (fields: Record<string, string>) => {
    const size = /^(\d{1,5})x(\d{1,5})$/.exec(fields[TunnelHeader.resize] ?? "");
    const [cols, rows] = [Number(size?.[1]), Number(size?.[2])];
    if (size && cols >= 1 && rows >= 1 && cols <= 10_000 && rows <= 10_000) terminal.resize(cols, rows);
  });
  stream.once("close", () => {
    io.destroy();
    if (!exited) gone();
  });
  const shown = new Promise<void>((resolve) => {
    io.once("end", resolve);
    io.once("close", resolve);
  });
  void Promise.all([terminal.exited.catch((err: Error) => err), shown]).then(([result]) => {
    exited = true;
    // What the caller sends from now goes nowhere.
    stream.unpipe(io);
    stream.resume();
    if (stream.destroyed) return;
    if (result instanceof Error) {
      stream.destroy(result);
      return;
    }
    stream.endWith({ [TunnelHeader.exit]: exitOf(result) });
    setTimeout(() => stream.destroy(), END_WAIT_MS).unref();
  });
}

/** `Boxcar-Exit`'s value: the exit code, or the signal that ended it. */
function exitOf(result: ExecResult): string {
  if (result.exitCode !== null) return String(result.exitCode);
  return result.signal ?? "SIGKILL";
}
