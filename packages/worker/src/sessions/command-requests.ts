import type { Topology } from "@boxcar/fabric";
import { nowIso } from "@boxcar/fabric/internal";
import {
  BoxcarError,
  ErrorCode,
  type ExecReply,
  ExecRequest,
  InputRequest,
  type ProcessInfo,
  ProcessRef,
  parseWith,
  type SessionEvent,
  SessionRef,
  StartRequest,
  toErrorInfo,
  WaitRequest,
} from "@boxcar/protocol";
import { workspaceCwd } from "../workspace/workspace-path.js";
import type { HeldSession } from "./held-session.js";
import { openStdin } from "./process-input.js";
import { commandOptions, liveOutput } from "./session-commands.js";

/** What the session host lends the command requests. */
export interface CommandHost {
  /** The session held here; a paused one is refused unless `whilePaused` (what needs nothing of its sandbox). */
  holding(id: string, whilePaused?: boolean): HeldSession;
  topology(): Pick<Topology, "nc" | "names" | "artifacts">;
  event(held: HeldSession, type: SessionEvent["type"], extra?: Partial<SessionEvent>): Promise<void>;
  save(held: HeldSession): Promise<void>;
  /** Its idle clock may start again (a process ended). */
  idle(held: HeldSession): void;
  /** A command let go of the session's lock: its idle clock starts, the next job in line takes the lock, its record is saved. */
  released(held: HeldSession): Promise<void> | undefined;
}

/** The session requests about commands (`exec`) and background processes, by the last token of their subject. */
export function commandRequests(host: CommandHost): Record<string, (body: unknown) => Promise<unknown>> {
  return {
    exec: (body) => exec(host, body),
    start: (body) => startInBackground(host, body),
    // Listing and waiting ask nothing of the sandbox: a paused session answers them.
    processes: async (body) => ({ processes: host.holding(parseWith(SessionRef, body, "request").id, true).background.list() }),
    wait: async (body) => {
      const { id, execId, timeout } = parseWith(WaitRequest, body, "request");
      return host.holding(id, true).background.wait(execId, timeout);
    },
    kill: async (body) => {
      const { id, execId } = parseWith(ProcessRef, body, "request");
      return { process: host.holding(id).background.kill(execId) };
    },
    input: async (body) => {
      const { id, execId, data, close } = parseWith(InputRequest, body, "request");
      return host.holding(id).background.input(execId, Buffer.from(data, "base64"), close);
    },
  };
}

/**
 * Starts a command in the session's background: it takes no lock (commands and jobs run beside
 * it) and the reply comes at once; its output goes live as an exec's, and `sessions.wait` gives its end.
 */
async function startInBackground(host: CommandHost, body: unknown): Promise<{ process: ProcessInfo }> {
  const request = parseWith(StartRequest, body, "request");
  const held = host.holding(request.id);
  // Refused before anything runs: a folder out of the workspace.
  const cwd = request.cwd === undefined ? undefined : workspaceCwd(request.cwd);
  const execId = `${request.id}.${held.record.execs + 1}`;
  // Its stdin kept open for `sessions.input`: the helper's pipe (Docker), or a named pipe (host).
  const stdin = request.openStdin ? await openStdin(held.sandbox, execId, request.argv) : undefined;
  held.record = { ...held.record, execs: held.record.execs + 1 };
  const output = liveOutput(held, execId, host.topology());
  const first = stdin && !stdin.firstWithStart ? request.stdin : undefined;
  const started = { ...request, ...(first !== undefined ? { stdin: undefined } : {}) };
  let process: ProcessInfo;
  try {
    process = held.background.start(execId, request.argv, {
      output,
      timeoutMs: request.timeout,
      stdin,
      run: (signal) => held.sandbox.exec(stdin?.argv ?? request.argv, commandOptions(held, started, output, cwd, signal, stdin?.env)),
      ended: (reply) => {
        if (reply.kept) held.kept.push({ execId, kept: reply.kept });
        void host.event(held, "exec_exited", { execId, exitCode: reply.exitCode, signal: reply.signal, durationMs: reply.durationMs });
        host.idle(held);
      },
    });
  } catch (err) {
    stdin?.dispose();
    throw err;
  }
  // What its start gives it, through the pipe (host): it stays open after.
  if (first !== undefined) void held.background.input(execId, Buffer.from(first, "base64"), false).catch(() => {});
  held.record = { ...held.record, lastUsedAt: nowIso() };
  await Promise.all([host.event(held, "exec_started", { execId }), host.save(held)]);
  return { process };
}

/**
 * Runs a command in the session, holding its lock (one at a time): its output live, and its end
 * (and what was kept whole) in the reply.
 */
async function exec(host: CommandHost, body: unknown): Promise<ExecReply> {
  const request = parseWith(ExecRequest, body, "request");
  const held = host.holding(request.id);
  if (held.running) {
    throw new BoxcarError(ErrorCode.conflict, `session ${request.id} is running ${held.running.execId}: one command at a time`);
  }
  // Refused before anything runs: a folder out of the workspace.
  const cwd = request.cwd === undefined ? undefined : workspaceCwd(request.cwd);
  // Its number taken at once: a process started in the background meanwhile takes the next.
  const execId = `${request.id}.${held.record.execs + 1}`;
  held.record = { ...held.record, execs: held.record.execs + 1 };
  const stop = new AbortController();
  const running = { execId, stop, cancelled: false };
  held.running = running;
  clearTimeout(held.idle);
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    stop.abort();
  }, request.timeout);
  const output = liveOutput(held, execId, host.topology());
  const { tails } = output;
  // The events and the record are stored while the command runs and as the reply goes, not
  // one after another before it: a command's round trip waits for them once (published on one
  // connection, they are stored in order).
  const started = host.event(held, "exec_started", { execId });
  let exited: Promise<void> | undefined;
  try {
    const result = await held.sandbox.exec(request.argv, commandOptions(held, request, output, cwd, stop.signal));
    const kept = await output.end();
    if (kept) held.kept.push({ execId, kept });
    const reply: ExecReply = {
      execId,
      exitCode: result.exitCode,
      signal: result.signal,
      timedOut,
      cancelled: running.cancelled,
      durationMs: result.durationMs,
      stdout: tails.stdout.base64(),
      stderr: tails.stderr.base64(),
      truncated: tails.stdout.truncated || tails.stderr.truncated,
      ...(kept ? { kept } : {}),
    };
    exited = host.event(held, "exec_exited", {
      execId,
      exitCode: result.exitCode,
      signal: result.signal,
      durationMs: result.durationMs,
    });
    return reply;
  } catch (err) {
    // Did not start (no such command, no such folder) or its sandbox ended: the history says so.
    exited = host.event(held, "exec_exited", { execId, error: toErrorInfo(err) });
    throw err;
  } finally {
    clearTimeout(timer);
    held.running = undefined;
    held.record = { ...held.record, lastUsedAt: nowIso() };
    const saved = host.released(held);
    await Promise.all([started, exited, saved]);
  }
}
