import type { Topology } from "@boxcar/fabric";
import { nowIso } from "@boxcar/fabric";
import { ExecRequest, type ProcessInfo, ProcessRef, parseWith, type SessionEvent, SessionRef, WaitRequest } from "@boxcar/protocol";
import { workspaceCwd } from "../workspace/workspace-path.js";
import type { HeldSession } from "./held-session.js";
import { commandOptions, liveOutput } from "./session-commands.js";

/** What the session host lends the background requests. */
export interface BackgroundHost {
  holding(id: string): HeldSession;
  topology(): Pick<Topology, "nc" | "names">;
  event(held: HeldSession, type: SessionEvent["type"], extra?: Partial<SessionEvent>): Promise<void>;
  save(held: HeldSession): Promise<void>;
  /** Its idle clock may start again (a process ended). */
  idle(held: HeldSession): void;
}

/** The session requests about background processes, by the last token of their subject. */
export function backgroundRequests(host: BackgroundHost): Record<string, (body: unknown) => Promise<unknown>> {
  return {
    start: (body) => startInBackground(host, body),
    processes: async (body) => ({ processes: host.holding(parseWith(SessionRef, body, "request").id).background.list() }),
    wait: async (body) => {
      const { id, execId, timeout } = parseWith(WaitRequest, body, "request");
      return host.holding(id).background.wait(execId, timeout);
    },
    kill: async (body) => {
      const { id, execId } = parseWith(ProcessRef, body, "request");
      return { process: host.holding(id).background.kill(execId) };
    },
  };
}

/**
 * Starts a command in the session's background: it takes no lock (commands and jobs run beside
 * it) and the reply comes at once; its output goes live as an exec's, and `sessions.wait` gives its end.
 */
async function startInBackground(host: BackgroundHost, body: unknown): Promise<{ process: ProcessInfo }> {
  const request = parseWith(ExecRequest, body, "request");
  const held = host.holding(request.id);
  // Refused before anything runs: a folder out of the workspace.
  const cwd = request.cwd === undefined ? undefined : workspaceCwd(request.cwd);
  const execId = `${request.id}.${held.record.execs + 1}`;
  held.record = { ...held.record, execs: held.record.execs + 1 };
  const output = liveOutput(held, execId, host.topology());
  const process = held.background.start(execId, request.argv, {
    output,
    timeoutMs: request.timeout,
    run: (signal) => held.sandbox.exec(request.argv, commandOptions(held, request, output, cwd, signal)),
    ended: (reply) => {
      void host.event(held, "exec_exited", { execId, exitCode: reply.exitCode, signal: reply.signal, durationMs: reply.durationMs });
      host.idle(held);
    },
  });
  held.record = { ...held.record, lastUsedAt: nowIso() };
  await Promise.all([host.event(held, "exec_started", { execId }), host.save(held)]);
  return { process };
}
