/**
 * The sessions a worker holds (docs/sessions.md): a sandbox kept between commands, one of the
 * worker's slots while it is open, and its record in the sessions bucket. Dispatchers ask on
 * `<prefix>.sess.<workerId>.<op>` after checking the caller; this side keeps the lock (one
 * command at a time; processes in the background take none), the idle and lifetime bounds, and
 * the events. Host and Docker sandboxes (a backend's `createSession`); an E2B agent's session
 * is refused, saying so.
 *
 * This file is the host: the requests it answers and the jobs it lends sessions to. Elsewhere: a
 * held session and its lock (held-session.ts), a command's environment and output
 * (session-commands.ts), background processes (background-*.ts, their input in
 * process-input.ts), file requests (file-requests.ts, big files by ranges in ranged-files.ts),
 * watches (workspace-watches.ts, through the helper's verbs in helper-verbs.ts), connections to
 * its ports (session-tunnels.ts), shells on a terminal (session-shells.ts), what a new
 * workspace starts with (session-seed.ts, git-seed.ts). Pausing is here (`pause`, `resume`). */

import { randomBytes } from "node:crypto";
import { Readable } from "node:stream";
import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { nowIso, publishEvent } from "@boxcar/fabric/internal";
import {
  AgentDefinition,
  BoxcarError,
  ErrorCode,
  PauseRequest,
  PROTOCOL_VERSION,
  parseWith,
  type ResolvedRuntime,
  type SandboxInfo,
  type SessionEvent,
  type SessionRecord,
  SessionRef,
  type SnapshotInfo,
  toErrorInfo,
  WorkerOpenSession,
} from "@boxcar/protocol";
import { checkAgentPolicy, resolveRuntime } from "@boxcar/protocol/internal";
import type { ObjectStore } from "@nats-io/obj";
import type { Msg, Subscription } from "@nats-io/transport-node";
import type { Slots } from "../intake/slots.js";
import type { Sandbox, SandboxBackend, SandboxProvider, SessionSandbox } from "../sandbox/sandbox.js";
import { sessionJobSandbox } from "../sandbox/session-job-sandbox.js";
import type { ResolvedWorkerOptions } from "../worker-options.js";
import { AgentPaths, collectSecrets } from "../workspace/agent-contract.js";
import { BackgroundProcesses } from "./background-processes.js";
import { commandRequests } from "./command-requests.js";
import { fileRequests } from "./file-requests.js";
import { type HeldSession, handOn, NotHeld, type Running, waitFor } from "./held-session.js";
import { seedOf } from "./session-seed.js";
import { shellRequests } from "./session-shells.js";
import { SessionTunnels, tunnelRequests } from "./session-tunnels.js";
import { removeKeptOutput } from "./whole-output.js";
import { SessionWatches, watchRequests } from "./workspace-watches.js";

/** Why a session of this kind of sandbox cannot be paused. */
function cannotPause(kind: string): string {
  if (kind === "host") {
    return "a host session cannot be paused: its commands run as the worker's own user, so a SIGSTOP of their process groups would miss what left them (setsid) and any of them could undo it (SIGCONT); snapshot it and close it instead";
  }
  if (kind === "e2b") {
    return "an E2B session cannot be paused here: E2B's own pause is a beta feature of its API, not built in Boxcar; snapshot it and close it instead";
  }
  return `a ${kind} session cannot be paused`;
}

/** How long opening a session waits for a slot to free (a pool's sweep holds its free slots for a moment while it asks for work). */
const SLOT_WAIT_MS = 2_000;

/** A session's sandbox lent to a job for its run (`SessionHost.lend`). */
export interface SessionLease {
  /** The session's sandbox as a job's; destroying it does nothing. */
  sandbox: Sandbox;
  info: SandboxInfo;
  /** The session's agent. */
  agent: string;
  /** Its agent's secrets: an admin's session has them, others none (as its commands). */
  secrets: Map<string, string>;
  /** Aborts when the session's owner cancels the job (`sessions.cancel`) or the session closes. */
  stopped: AbortSignal;
  /** Whether its owner cancelled it; else why the session closed, if it did. */
  readonly cancelled: boolean;
  readonly closedWith: string | undefined;
  /** The job claimed, its attempt starts in the session: a `job_started` event says so. */
  begin(): Promise<void>;
  /** Gives the lock back: the session is idle again from now. `state`: how the attempt ended (a `job_ended` event, once begun). */
  release(state: string): void;
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
  /** Sessions being closed: a request meanwhile is told so (not that the session is unknown here). */
  private readonly closing = new Set<string>();
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

  /** What a dispatcher may ask, by the last token of the subject. */
  private readonly operations: Readonly<Record<string, (body: unknown) => Promise<unknown>>> = {
    open: (body) => this.open(body),
    cancel: async (body) => this.cancel(parseWith(SessionRef, body, "request").id),
    ...commandRequests({
      holding: (id, whilePaused) => this.holding(id, whilePaused),
      topology: () => this.ctx.topology,
      event: (held, type, extra) => this.event(held, type, extra),
      save: (held) => this.save(held),
      idle: (held) => {
        if (this.held.get(held.record.id) === held && !held.running) this.idleFrom(held);
      },
      released: (held) => {
        if (this.held.get(held.record.id) !== held) return undefined;
        this.idleFrom(held);
        handOn(held);
        return this.save(held).catch((err: unknown) =>
          this.ctx.log.warn({ err, session: held.record.id }, "could not save a session's record"),
        );
      },
    }),
    snapshot: (body) => this.snapshot(parseWith(SessionRef, body, "request").id),
    pause: (body) => {
      const { id, timeout } = parseWith(PauseRequest, body, "request");
      return this.pause(id, timeout);
    },
    resume: (body) => this.resume(parseWith(SessionRef, body, "request").id),
    close: (body) => this.close(parseWith(SessionRef, body, "request").id, "closed"),
    ...fileRequests(this.withFiles.bind(this)),
    ...watchRequests((id) => this.holding(id)),
    ...tunnelRequests(
      (id) => this.holding(id),
      () => this.ctx.topology,
    ),
    ...shellRequests({
      holding: (id) => this.holding(id),
      topology: () => this.ctx.topology,
      event: (held, type, extra) => this.event(held, type, extra),
      save: (held) => this.save(held),
      idle: (held) => {
        if (this.held.get(held.record.id) === held && !held.running) this.idleFrom(held);
      },
      traffic: (held) => this.trafficIn(held),
    }),
  };

  /**
   * The session this worker holds; one it is closing is refused, saying so, and a paused one
   * too unless `whilePaused` (the request needs nothing of its sandbox): it would wait, held
   * still with the rest, for as long as the pause lasts.
   */
  private holding(id: string, whilePaused = false): HeldSession {
    if (this.closing.has(id)) throw new BoxcarError(ErrorCode.conflict, `session ${id} is closing`);
    const held = this.held.get(id);
    if (!held) throw new NotHeld(this.ctx.workerId, id);
    if (held.paused && !whilePaused) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `session ${id} is paused: resume it first (boxcar session resume ${id}; the SDK's resumeSession)`,
      );
    }
    return held;
  }

  /** A file operation in the session; its idle clock starts again once the operation is over. */
  private async withFiles<T>(id: string, use: (held: HeldSession) => Promise<T>): Promise<T> {
    const held = this.holding(id);
    try {
      return await use(held);
    } finally {
      if (this.held.get(id) === held && !held.running) this.idleFrom(held);
    }
  }

  private async answer(msg: Msg): Promise<void> {
    // Answers go to a dispatcher's inbox only: a worker may answer what it is sent, and a reply
    // subject elsewhere (JetStream's API, say) must never be one.
    if (!msg.reply?.startsWith("_INBOX.")) return;
    const op = msg.subject.slice(msg.subject.lastIndexOf(".") + 1);
    let reply: unknown;
    try {
      const body: unknown = JSON.parse(msg.string());
      const handler = Object.hasOwn(this.operations, op) ? this.operations[op] : undefined;
      if (!handler) throw new BoxcarError(ErrorCode.invalid, `no session operation ${op}`);
      reply = { ok: true, data: await handler(body) };
    } catch (err) {
      if (!(err instanceof BoxcarError)) this.ctx.log.error({ err, op }, "a session request failed");
      // `held: false` tells the dispatcher the session is gone from here (this worker restarted), unlike a missing file.
      reply = { ok: false, error: toErrorInfo(err), ...(err instanceof NotHeld ? { held: false } : {}) };
    }
    try {
      msg.respond(JSON.stringify(reply));
    } catch (err) {
      this.ctx.log.warn({ err, op }, "could not answer a session request");
    }
  }

  private async open(body: unknown): Promise<SessionRecord> {
    const { id, owner, request, agent: raw, byAdmin, from, artifacts, template } = parseWith(WorkerOpenSession, body, "request");
    const asDefined = parseWith(AgentDefinition, raw, "agent");
    // A template's image in place of the agent's; the rest of its runtime (limits, network) as the agent says.
    const agent = template ? { ...asDefined, runtime: { ...asDefined.runtime, image: template.image } } : asDefined;
    const { options } = this.ctx;
    checkAgentPolicy(agent, options.agentPolicy, "this worker's policy");
    const runtime = resolveRuntime(agent.runtime, agent.trusted, this.ctx.capabilities(), options.policy);
    if (template && runtime.kind !== "docker") {
      throw new BoxcarError(
        ErrorCode.invalid,
        `template ${template.name} is a Docker image, and a session of ${agent.name} would run in a ${runtime.kind} sandbox here (${runtime.reason}): templates are for Docker sessions`,
      );
    }
    if (runtime.kind === "host" && !byAdmin) {
      throw new BoxcarError(
        ErrorCode.forbidden,
        `a session of ${agent.name} would run in a host sandbox, where commands run as the worker's own user: only an admin may open one (give the agent a Docker runtime for others)`,
      );
    }
    const provider = this.ctx.providers.get(runtime.kind);
    if (!provider?.createSession) {
      throw new BoxcarError(
        ErrorCode.noSandbox,
        `agent ${agent.name} runs in ${runtime.kind} sandboxes (${runtime.reason}), which hold no sessions on this worker`,
      );
    }
    // Whatever a command gets its caller can read (`env`, a file): the agent's secrets go to an admin's sessions only.
    const secrets = byAdmin ? collectSecrets(agent, options.secretsEnv) : new Map<string, string>();
    if (!(await this.ctx.slots.acquireWithin(SLOT_WAIT_MS))) {
      throw new BoxcarError(ErrorCode.unavailable, `worker ${this.ctx.workerId} has no free slot`);
    }
    // What the workspace starts with: a snapshot's files, or a clone made here, outside the sandbox.
    const seeded: { source?: SessionRecord["source"] } = {};
    const seed = seedOf(this.ctx, { from, git: request.git, artifacts }, agent, seeded);
    let sandbox: SessionSandbox;
    try {
      sandbox = await provider.createSession(
        {
          id: `sbx-${id}`,
          jobId: id,
          attempt: 0,
          workerId: this.ctx.workerId,
          runtime: agent.runtime,
          lifetimeMs: request.maxLifetime,
          ...(template ? { template } : {}),
        },
        seed,
      );
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
      ...(seeded.source ? { source: seeded.source } : {}),
      ...(template ? { template: template.name } : {}),
    };
    const held: HeldSession = {
      record,
      sandbox,
      secrets,
      env: { ...agent.env },
      waiting: [],
      background: new BackgroundProcesses(),
      kept: [],
      copies: new Map(),
      watches: new SessionWatches((change) => this.event(held, "file_changed", change)),
      tunnels: new SessionTunnels(id, () => this.trafficIn(held), this.ctx.log),
    };
    this.held.set(id, held);
    void sandbox.ended?.then((reason) => {
      if (this.held.get(id) === held) void this.close(id, `sandbox_ended: ${reason}`).catch(() => {});
    });
    held.lifetime = setTimeout(() => void this.close(id, "lifetime").catch(() => {}), request.maxLifetime);
    this.idleFrom(held);
    try {
      await this.save(held);
    } catch (err) {
      // No record, no session: nobody could see or close it.
      await this.close(id, "failed").catch(() => {});
      throw err;
    }
    await this.event(held, "opened", from === undefined ? {} : { snapshot: from });
    return record;
  }

  /**
   * Lends session `id`'s sandbox to a job for its run (docs/sessions.md#jobs-in-a-session),
   * holding the session's lock until the lease is released, and clears what the agent contract
   * leaves of a job before (its result file). While a command or another job has the lock, the
   * job waits in line for it (see `waitFor`). Throws `session_lost` when this worker does not
   * hold the session (it closed, or the worker restarted), `forbidden` when the job is not the
   * session's owner's, or of another agent that does not allow sessions, and `no_sandbox` when
   * the job's agent would run in another kind of sandbox (`runtime`, as this worker resolves it).
   */
  async lend(
    id: string,
    job: { jobId: string; owner: string; agent: AgentDefinition; runtime: ResolvedRuntime },
    signal: AbortSignal,
  ): Promise<SessionLease> {
    const held = this.held.get(id);
    if (!held || this.closing.has(id)) {
      throw new BoxcarError(
        ErrorCode.sessionLost,
        `session ${id} is not open on worker ${this.ctx.workerId} (it closed, or its worker restarted)`,
      );
    }
    if (held.record.owner !== job.owner || (held.record.agent !== job.agent.name && !job.agent.sessions)) {
      throw new BoxcarError(ErrorCode.forbidden, `session ${id} is not ${job.owner}'s, or agent ${job.agent.name} does not allow sessions`);
    }
    // The agent must be one this worker would run in such a sandbox (an untrusted one never in a host session, say).
    if (job.runtime.kind !== held.record.sandbox.kind) {
      throw new BoxcarError(
        ErrorCode.noSandbox,
        `agent ${job.agent.name} runs in ${job.runtime.kind} sandboxes (${job.runtime.reason}), and session ${id} is a ${held.record.sandbox.kind} one`,
      );
    }
    const running: Running = { execId: job.jobId, stop: new AbortController(), cancelled: false };
    // A paused session's job waits in line until it is resumed (`handOn` gives it the lock then).
    if (held.running || held.waiting.length > 0 || held.paused) await waitFor(held, running, signal);
    else held.running = running;
    clearTimeout(held.idle);
    let released = false;
    let begun = false;
    const release = (state: string) => {
      if (released) return;
      released = true;
      if (held.running === running) held.running = undefined;
      if (begun) void this.event(held, "job_ended", { jobId: job.jobId, state });
      if (this.held.get(id) !== held) return;
      held.record = { ...held.record, lastUsedAt: nowIso() };
      this.idleFrom(held);
      handOn(held);
      void this.save(held).catch((err: unknown) => this.ctx.log.warn({ err, session: id }, "could not save a session's record"));
    };
    try {
      // What the job before left for the agent to write, or to read: its result, usage and signals.
      for (const left of [AgentPaths.result, AgentPaths.usage, AgentPaths.signals]) await held.sandbox.sessionFiles.remove(left);
    } catch (err) {
      release("failed");
      throw err;
    }
    return {
      sandbox: sessionJobSandbox(held.sandbox),
      info: held.record.sandbox,
      agent: held.record.agent,
      secrets: held.secrets,
      stopped: running.stop.signal,
      get cancelled() {
        return running.cancelled;
      },
      get closedWith() {
        return running.closedWith;
      },
      begin: () => {
        begun = true;
        return this.event(held, "job_started", { jobId: job.jobId });
      },
      release,
    };
  }

  /**
   * Stores the session's workspace (its folders and regular files) as a snapshot, under a new id,
   * with the Object Store's digest of it.
   */
  private async snapshot(id: string): Promise<SnapshotInfo> {
    const held = this.holding(id);
    if (held.snapshotting) throw new BoxcarError(ErrorCode.conflict, `session ${id} is being snapshotted: one snapshot at a time`);
    const snapshotId = `snap-${Date.now().toString(36)}${randomBytes(6).toString("hex")}`;
    const createdAt = nowIso();
    // Busy while it is taken (from before the first wait, so a second is refused): the idle clock waits, as for a command.
    held.snapshotting = true;
    clearTimeout(held.idle);
    let info: Awaited<ReturnType<ObjectStore["put"]>>;
    try {
      const store = await this.ctx.topology.snapshots();
      const archive = await held.sandbox.packWorkspace();
      info = await store.put(
        { name: snapshotId, metadata: { owner: held.record.owner, agent: held.record.agent, session: id, createdAt } },
        Readable.toWeb(archive) as ReadableStream<Uint8Array>,
      );
    } catch (err) {
      if (err instanceof BoxcarError) throw err;
      // Not the worker's paths: the caller learns what failed, the log has the rest.
      this.ctx.log.warn({ err, session: id }, "could not take a snapshot");
      throw new BoxcarError(
        ErrorCode.sandboxFailed,
        `could not take a snapshot of session ${id}${this.held.has(id) ? "" : ": it closed meanwhile"}`,
      );
    } finally {
      held.snapshotting = false;
      if (this.held.get(id) === held && !held.running) this.idleFrom(held);
    }
    const snapshot: SnapshotInfo = {
      id: snapshotId,
      owner: held.record.owner,
      agent: held.record.agent,
      session: id,
      createdAt,
      size: info.size,
      digest: info.digest,
    };
    await this.event(held, "snapshot", { snapshot: snapshotId });
    return snapshot;
  }

  /**
   * Pauses the session (docs/sessions.md#pause): its sandbox holds every process where it is (a
   * container frozen), its idle clock and its processes' timeouts wait, and requests that need
   * it running are refused until `resume`; it closes (`pause_timeout`) if still paused after
   * `timeoutMs`. Refused while a command or job holds its lock or a snapshot is taken, and where
   * the backend cannot hold its processes (host, E2B).
   */
  private async pause(id: string, timeoutMs: number): Promise<SessionRecord> {
    const held = this.holding(id, true);
    if (held.paused) throw new BoxcarError(ErrorCode.conflict, `session ${id} is paused already`);
    if (!held.sandbox.pause || !held.sandbox.resume) throw new BoxcarError(ErrorCode.invalid, cannotPause(held.sandbox.kind));
    if (held.running) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `session ${id} is running ${held.running.execId}: pause it once that ends, or cancel it (boxcar session cancel ${id})`,
      );
    }
    if (held.snapshotting) throw new BoxcarError(ErrorCode.conflict, `session ${id} is being snapshotted: pause it once that is done`);
    // Paused from now, before the first wait: a request meanwhile is refused, as it will be.
    held.paused = { resuming: false, pauseEnds: setTimeout(() => void this.close(id, "pause_timeout").catch(() => {}), timeoutMs) };
    clearTimeout(held.idle);
    held.background.pause();
    try {
      await held.sandbox.pause();
    } catch (err) {
      clearTimeout(held.paused.pauseEnds);
      held.paused = undefined;
      held.background.resume();
      if (this.held.get(id) === held) this.idleFrom(held);
      throw err;
    }
    const now = Date.now();
    held.record = { ...held.record, pausedAt: new Date(now).toISOString(), pauseEndsAt: new Date(now + timeoutMs).toISOString() };
    await this.event(held, "paused");
    await this.save(held);
    return held.record;
  }

  /** Lets a paused session go on: its processes from where they were, its idle clock from now, its waiting jobs in turn. */
  private async resume(id: string): Promise<SessionRecord> {
    const held = this.holding(id, true);
    const { paused } = held;
    if (!paused) throw new BoxcarError(ErrorCode.conflict, `session ${id} is not paused`);
    if (paused.resuming) throw new BoxcarError(ErrorCode.conflict, `session ${id} is being resumed`);
    paused.resuming = true;
    try {
      await held.sandbox.resume?.();
    } catch (err) {
      paused.resuming = false;
      throw err;
    }
    // Closed meanwhile: its close let the sandbox go and wrote its record.
    if (this.held.get(id) !== held) throw new BoxcarError(ErrorCode.conflict, `session ${id} closed while it was resumed`);
    clearTimeout(paused.pauseEnds);
    held.paused = undefined;
    held.background.resume();
    const { pausedAt: _at, pauseEndsAt: _ends, ...record } = held.record;
    held.record = { ...record, lastUsedAt: nowIso() };
    if (this.held.get(id) === held) {
      handOn(held);
      if (!held.running) this.idleFrom(held);
    }
    await this.event(held, "resumed");
    await this.save(held);
    return held.record;
  }

  /** Stops the command running in the session (as a timeout does); its exec's reply says `cancelled`. */
  private cancel(id: string): SessionRecord {
    const held = this.holding(id);
    if (!held.running) throw new BoxcarError(ErrorCode.conflict, `session ${id} runs no command`);
    held.running.cancelled = true;
    held.running.stop.abort();
    return held.record;
  }

  /** Ends the session: its command, its sandbox, its slot; its record says why. */
  private async close(id: string, reason: string): Promise<SessionRecord> {
    const held = this.holding(id, true);
    this.closing.add(id);
    this.held.delete(id);
    try {
      clearTimeout(held.idle);
      clearTimeout(held.lifetime);
      if (held.paused) {
        // Let go first, so its processes can be stopped as any session's are; a sandbox that
        // cannot be is removed at once (which ends what waited on it).
        clearTimeout(held.paused.pauseEnds);
        await (held.paused.resuming ? Promise.resolve() : (held.sandbox.resume?.() ?? Promise.resolve())).catch(async (err: unknown) => {
          this.ctx.log.warn({ err, session: id }, "could not resume a paused session to close it: removing its sandbox");
          await held.sandbox.destroy().catch(() => {});
        });
        held.paused = undefined;
      }
      if (held.running) {
        held.running.closedWith = reason;
        held.running.stop.abort();
      }
      held.tunnels.closeAll(`session ${id} closed (${reason})`);
      await Promise.all([held.background.stopAll(), held.watches.stopAll()]);
      void removeKeptOutput(this.ctx.topology, id, held.kept).catch((err: unknown) =>
        this.ctx.log.warn({ err, session: id }, "could not remove a session's kept output"),
      );
      for (const waiter of held.waiting.splice(0)) {
        waiter.fail(new BoxcarError(ErrorCode.sessionLost, `session ${id} closed (${reason}) while the job waited for it`));
      }
      await held.sandbox.destroy().catch((err: unknown) => this.ctx.log.warn({ err, session: id }, "could not remove a session's sandbox"));
      this.ctx.slots.release(1);
      held.record = { ...held.record, state: "closed", closedAt: nowIso(), reason };
      // The event first: one who sees the record closed (a follower) finds the event stored.
      await this.event(held, "closed", { reason });
      await this.save(held).catch((err: unknown) => this.ctx.log.warn({ err, session: id }, "could not save a session's record"));
    } finally {
      this.closing.delete(id);
    }
    return held.record;
  }

  /** Bytes went through a tunnel of the session's: it is in use, and its idle clock starts again (at most once a second). */
  private trafficIn(held: HeldSession): void {
    const now = Date.now();
    if (now - (held.trafficAt ?? 0) < 1_000) return;
    held.trafficAt = now;
    if (this.held.get(held.record.id) === held && !held.running && !held.snapshotting) this.idleFrom(held);
  }

  /** Starts the idle clock; a session with a process in the background is not idle, and its clock starts again. */
  private idleFrom(held: HeldSession): void {
    clearTimeout(held.idle);
    // A paused session is not idle: its clock starts again once it is resumed.
    if (held.paused) return;
    held.idle = setTimeout(() => {
      if (held.background.running > 0) this.idleFrom(held);
      else void this.close(held.record.id, "idle").catch(() => {});
    }, held.record.idleTimeoutMs);
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
