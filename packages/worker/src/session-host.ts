/**
 * The sessions a worker holds (docs/sessions.md): a sandbox kept between commands, one of the
 * worker's slots while it is open, and its record in the sessions bucket. Dispatchers ask on
 * `<prefix>.sess.<workerId>.<op>` (open, exec, close) after checking the caller; this side
 * keeps the lock (one command at a time), the idle and lifetime bounds, and the events.
 *
 * Only host sandboxes so far: a Docker or E2B sandbox runs one command in its life, and a
 * session of one of those agents is refused with a message that says so.
 */

import type { Logger } from "@boxcar/client";
import { nowIso, publishEvent, type Topology } from "@boxcar/fabric";
import {
  AgentDefinition,
  BoxcarError,
  checkAgentPolicy,
  ErrorCode,
  type ExecReply,
  ExecRequest,
  MAX_EXEC_REPLY_OUTPUT,
  PROTOCOL_VERSION,
  parseWith,
  resolveRuntime,
  type SessionEvent,
  type SessionRecord,
  SessionRef,
  toErrorInfo,
  WorkerOpenSession,
} from "@boxcar/protocol";
import { type Msg, headers as natsHeaders, type Subscription } from "@nats-io/transport-node";
import { AgentPaths, collectSecrets } from "./agent-contract.js";
import { StreamRedactor } from "./redactor.js";
import type { Sandbox, SandboxBackend, SandboxProvider } from "./sandbox.js";
import type { Slots } from "./slots.js";
import type { ResolvedWorkerOptions } from "./worker-options.js";

/** The most of a command's output published live (as a job's); the reply carries the end of it all. */
const MAX_LIVE_OUTPUT = 4 * 1024 * 1024;

interface HeldSession {
  record: SessionRecord;
  sandbox: Sandbox;
  secrets: Map<string, string>;
  /** The agent's own environment variables. */
  env: Record<string, string>;
  /** The command running now, if any: its id and how to stop it. */
  running?: { execId: string; stop: AbortController };
  idle?: NodeJS.Timeout;
  lifetime?: NodeJS.Timeout;
}

export interface SessionHostContext {
  topology: Topology;
  workerId: string;
  options: ResolvedWorkerOptions;
  providers: ReadonlyMap<SandboxBackend, SandboxProvider>;
  capabilities: () => ReadonlySet<SandboxBackend>;
  slots: Slots;
  log: Logger;
}

export class SessionHost {
  private readonly held = new Map<string, HeldSession>();
  private sub: Subscription | undefined;

  constructor(private readonly ctx: SessionHostContext) {}

  /** How many sessions it holds (each holds a slot). */
  get size(): number {
    return this.held.size;
  }

  start(): void {
    const { names, nc } = this.ctx.topology;
    this.sub = nc.subscribe(names.subjects.session(this.ctx.workerId, "*"), {
      callback: (err, msg) => {
        // Refused by credentials from before sessions: the worker runs jobs as ever, without sessions.
        if (err) this.ctx.log.warn({ err }, "cannot take session requests (push the account again: boxcar auth push)");
        else void this.answer(msg);
      },
    });
  }

  /** Closes every session (the worker stops): their sandboxes go, their records say why. */
  async stop(): Promise<void> {
    this.sub?.unsubscribe();
    await Promise.allSettled([...this.held.keys()].map((id) => this.close(id, "worker_stopped")));
  }

  private async answer(msg: Msg): Promise<void> {
    // Answers go to a dispatcher's inbox only: a worker may answer what it is sent, and a reply
    // subject elsewhere (JetStream's API, say) must never be one.
    if (!msg.reply?.startsWith("_INBOX.")) return;
    const op = msg.subject.slice(msg.subject.lastIndexOf(".") + 1);
    let reply: unknown;
    try {
      const body: unknown = JSON.parse(msg.string());
      const data =
        op === "open"
          ? await this.open(body)
          : op === "exec"
            ? await this.exec(body)
            : op === "close"
              ? await this.close(parseWith(SessionRef, body, "request").id, "closed")
              : undefined;
      if (data === undefined) throw new BoxcarError(ErrorCode.invalid, `no session operation ${op}`);
      reply = { ok: true, data };
    } catch (err) {
      if (!(err instanceof BoxcarError)) this.ctx.log.error({ err, op }, "a session request failed");
      reply = { ok: false, error: toErrorInfo(err) };
    }
    try {
      msg.respond(JSON.stringify(reply));
    } catch (err) {
      this.ctx.log.warn({ err, op }, "could not answer a session request");
    }
  }

  private async open(body: unknown): Promise<SessionRecord> {
    const { id, owner, request, agent: raw, mayUseHost } = parseWith(WorkerOpenSession, body, "request");
    const agent = parseWith(AgentDefinition, raw, "agent");
    const { options } = this.ctx;
    checkAgentPolicy(agent, options.agentPolicy, "this worker's policy");
    const runtime = resolveRuntime(agent.runtime, agent.trusted, this.ctx.capabilities(), options.policy);
    if (runtime.kind !== "host") {
      throw new BoxcarError(
        ErrorCode.noSandbox,
        `agent ${agent.name} runs in ${runtime.kind} sandboxes (${runtime.reason}): sessions run in host sandboxes only so far (a trusted agent and a worker whose policy allows host)`,
      );
    }
    if (!mayUseHost) {
      throw new BoxcarError(
        ErrorCode.forbidden,
        `a session of ${agent.name} would run in a host sandbox, where commands run as the worker's own user: only an admin may open one (sessions in containers are not built yet)`,
      );
    }
    const provider = this.ctx.providers.get(runtime.kind);
    if (!provider) throw new BoxcarError(ErrorCode.noSandbox, `this worker has no ${runtime.kind} provider`);
    const secrets = collectSecrets(agent, options.secretsEnv);
    if (!this.ctx.slots.tryAcquire()) throw new BoxcarError(ErrorCode.unavailable, `worker ${this.ctx.workerId} has no free slot`);
    let sandbox: Sandbox;
    try {
      sandbox = await provider.create({ id: `sbx-${id}`, jobId: id, attempt: 0, workerId: this.ctx.workerId, runtime: agent.runtime });
    } catch (err) {
      this.ctx.slots.release(1);
      throw err;
    }
    const now = Date.now();
    const record: SessionRecord = {
      v: PROTOCOL_VERSION,
      id,
      owner,
      agent: agent.name,
      pool: agent.pool,
      workerId: this.ctx.workerId,
      sandbox: { kind: runtime.kind, id: sandbox.id, reason: runtime.reason },
      state: "open",
      createdAt: new Date(now).toISOString(),
      lastUsedAt: new Date(now).toISOString(),
      idleTimeoutMs: request.idleTimeout,
      expiresAt: new Date(now + request.maxLifetime).toISOString(),
      execs: 0,
    };
    const held: HeldSession = { record, sandbox, secrets, env: { ...agent.env } };
    this.held.set(id, held);
    held.lifetime = setTimeout(() => void this.close(id, "lifetime").catch(() => {}), request.maxLifetime);
    this.idleFrom(held);
    try {
      await this.save(held);
    } catch (err) {
      // No record, no session: nobody could see or close it.
      await this.close(id, "failed").catch(() => {});
      throw err;
    }
    await this.event(held, "opened");
    return record;
  }

  private async exec(body: unknown): Promise<ExecReply> {
    const request = parseWith(ExecRequest, body, "request");
    const held = this.held.get(request.id);
    if (!held) throw new BoxcarError(ErrorCode.notFound, `worker ${this.ctx.workerId} holds no session ${request.id}`);
    if (held.running) {
      throw new BoxcarError(ErrorCode.conflict, `session ${request.id} is running ${held.running.execId}: one command at a time`);
    }
    const execId = `${request.id}.${held.record.execs + 1}`;
    const stop = new AbortController();
    held.running = { execId, stop };
    clearTimeout(held.idle);
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      stop.abort();
    }, request.timeout);
    const tails = { stdout: new OutputTail(), stderr: new OutputTail() };
    const redactors = { stdout: new StreamRedactor([...held.secrets.values()]), stderr: new StreamRedactor([...held.secrets.values()]) };
    const { names, nc } = this.ctx.topology;
    const hdrs = natsHeaders();
    hdrs.set("Boxcar-Exec", execId);
    // The live copy stops at MAX_LIVE_OUTPUT a command, as a job's output does, so that one
    // command cannot push everyone's output out of the size-capped logs stream.
    let published = 0;
    const emit = (stream: "stdout" | "stderr", clean: Uint8Array) => {
      if (clean.length === 0) return;
      tails[stream].push(clean);
      if (published >= MAX_LIVE_OUTPUT) return;
      const part = clean.subarray(0, MAX_LIVE_OUTPUT - published);
      published += part.length;
      nc.publish(names.subjects.log(held.record.owner, request.id, stream), part, { headers: hdrs });
    };
    try {
      await this.event(held, "exec_started", { execId });
      const result = await held.sandbox.exec(request.argv, {
        // As a job's environment, less what only a job has (input, result, chain files).
        env: {
          PATH: held.sandbox.agentPath ?? process.env.PATH ?? "/usr/bin:/bin",
          HOME: held.sandbox.workspace,
          LANG: "C.UTF-8",
          TMPDIR: `${held.sandbox.workspace}/${AgentPaths.tmp}`,
          ...held.env,
          ...request.env,
          ...Object.fromEntries(held.secrets),
          BOXCAR_SESSION: request.id,
          BOXCAR_AGENT: held.record.agent,
          BOXCAR_WORKSPACE: held.sandbox.workspace,
        },
        signal: stop.signal,
        onOutput: (stream, chunk) => emit(stream, redactors[stream].push(chunk)),
      });
      // What a redactor held back, in case it was the start of a secret.
      for (const stream of ["stdout", "stderr"] as const) emit(stream, redactors[stream].end());
      const reply: ExecReply = {
        execId,
        exitCode: result.exitCode,
        signal: result.signal,
        timedOut,
        durationMs: result.durationMs,
        stdout: tails.stdout.base64(),
        stderr: tails.stderr.base64(),
        truncated: tails.stdout.truncated || tails.stderr.truncated,
      };
      await this.event(held, "exec_exited", {
        execId,
        exitCode: result.exitCode,
        signal: result.signal,
        durationMs: result.durationMs,
      });
      return reply;
    } finally {
      clearTimeout(timer);
      held.running = undefined;
      held.record = { ...held.record, execs: held.record.execs + 1, lastUsedAt: nowIso() };
      if (this.held.has(request.id)) {
        this.idleFrom(held);
        await this.save(held).catch((err: unknown) => this.ctx.log.warn({ err, session: request.id }, "could not save a session's record"));
      }
    }
  }

  /** Ends the session: its command, its sandbox, its slot; its record says why. */
  private async close(id: string, reason: string): Promise<SessionRecord> {
    const held = this.held.get(id);
    if (!held) throw new BoxcarError(ErrorCode.notFound, `worker ${this.ctx.workerId} holds no session ${id}`);
    this.held.delete(id);
    clearTimeout(held.idle);
    clearTimeout(held.lifetime);
    held.running?.stop.abort();
    await held.sandbox.destroy().catch((err: unknown) => this.ctx.log.warn({ err, session: id }, "could not remove a session's sandbox"));
    this.ctx.slots.release(1);
    held.record = { ...held.record, state: "closed", closedAt: nowIso(), reason };
    await this.save(held).catch((err: unknown) => this.ctx.log.warn({ err, session: id }, "could not save a session's record"));
    await this.event(held, "closed", { reason });
    return held.record;
  }

  private idleFrom(held: HeldSession): void {
    clearTimeout(held.idle);
    held.idle = setTimeout(() => void this.close(held.record.id, "idle").catch(() => {}), held.record.idleTimeoutMs);
  }

  private async save(held: HeldSession): Promise<void> {
    await (await this.ctx.topology.sessions()).put(held.record.id, JSON.stringify(held.record));
  }

  /** Publishes an event; one that cannot be stored is logged, and the command or session goes on. */
  private async event(held: HeldSession, type: SessionEvent["type"], extra: Partial<SessionEvent> = {}): Promise<void> {
    await publishEvent(this.ctx.topology, {
      v: PROTOCOL_VERSION,
      at: nowIso(),
      kind: "session",
      type,
      sessionId: held.record.id,
      owner: held.record.owner,
      agent: held.record.agent,
      workerId: this.ctx.workerId,
      ...extra,
    }).catch((err: unknown) => this.ctx.log.warn({ err, session: held.record.id, type }, "could not publish a session event"));
  }
}

/** The last `MAX_EXEC_REPLY_OUTPUT` bytes of a stream, for an exec's reply. */
class OutputTail {
  private chunks: Uint8Array[] = [];
  private size = 0;
  truncated = false;

  push(chunk: Uint8Array): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.size - (this.chunks[0]?.length ?? 0) >= MAX_EXEC_REPLY_OUTPUT) {
      this.size -= (this.chunks.shift() as Uint8Array).length;
      this.truncated = true;
    }
  }

  base64(): string {
    const all = Buffer.concat(this.chunks);
    if (all.length > MAX_EXEC_REPLY_OUTPUT) this.truncated = true;
    return all.subarray(Math.max(0, all.length - MAX_EXEC_REPLY_OUTPUT)).toString("base64");
  }
}
