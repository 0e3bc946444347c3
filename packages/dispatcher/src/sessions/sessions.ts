/**
 * The dispatcher's side of sessions: it checks a caller against a session's owner (from the
 * record its worker keeps), picks a worker to hold a new one, and asks the holding worker on
 * `<prefix>.sess.<workerId>.<op>`. The worker runs the sandbox, enforces the lock and the
 * timeouts, and writes the record; nothing of a session's commands or output is kept here.
 */

import { randomBytes } from "node:crypto";
import type { Topology } from "@boxcar/fabric";
import { getJson, listJson } from "@boxcar/fabric/internal";
import {
  type AgentDefinition,
  ApiEndpoint,
  type ApiReplyData,
  BoxcarError,
  ErrorCode,
  type ExecReply,
  type Identity,
  type KeptOutput,
  type OutputReply,
  type OutputRequest,
  type SessionRecord,
  SessionRecord as SessionRecordSchema,
  type SessionState,
  type SnapshotInfo,
  SnapshotInfo as SnapshotInfoSchema,
  type SystemPolicy,
  WorkerReply,
} from "@boxcar/protocol";
import { keptOutputObject, keptOutputSizes, mayAccess, quotaOf, SESSION_OUTPUT_SEGMENT } from "@boxcar/protocol/internal";
import type { ObjectInfo } from "@nats-io/obj";
import type { z } from "zod";
import type { WorkerDirectory } from "../catalog/worker-directory.js";
import { getRecord } from "../jobs/jobs.js";

/** How long a dispatcher waits for a worker to open a sandbox (a Docker image may be pulled). */
const OPEN_TIMEOUT_MS = 120_000;
/** Beyond an exec's own timeout: the worker's time to end it (a kill grace, its pipes) and answer. */
const EXEC_GRACE_MS = 30_000;
/** How long a dispatcher waits for a worker to close a session, cancel its command, or do a file operation. */
const WORKER_ANSWER_MS = 30_000;

/** An open request as `sessions.open` parsed it (its other fields, such as `git`, go on to the worker as they are). */
interface OpenRequest {
  agent?: string | undefined;
  from?: string | undefined;
  artifactsOf?: string | undefined;
  template?: string | undefined;
  idleTimeout: number;
  maxLifetime: number;
}

/** How long a dispatcher waits for a worker to pack and store a snapshot (up to a workspace's 1 GiB). */
const SNAPSHOT_TIMEOUT_MS = 600_000;

/** A snapshot as its object's metadata says; undefined for an object that is not one (or is damaged). */
function snapshotOf(info: ObjectInfo): SnapshotInfo | undefined {
  const parsed = SnapshotInfoSchema.safeParse({ id: info.name, ...info.metadata, size: info.size, digest: info.digest });
  return parsed.success ? parsed.data : undefined;
}

/** The worker's operation for each file endpoint. */
const FILE_OPERATIONS = {
  [ApiEndpoint.sessionsFilesRead]: "read",
  [ApiEndpoint.sessionsFilesWrite]: "write",
  [ApiEndpoint.sessionsFilesList]: "list",
  [ApiEndpoint.sessionsFilesRemove]: "remove",
  [ApiEndpoint.sessionsFilesStat]: "stat",
} as const;

/** How long a dispatcher waits for a file operation that may hash a file (a write checked against its SHA-256, a stat): up to a workspace's 1 GiB read in the session. */
const HASHING_ANSWER_MS = 150_000;
/** How long a dispatcher waits for a worker to write a process's input (it has 30 s to take it) or to start a watch (30 s to walk its folders). */
const SLOW_ANSWER_MS = 45_000;

/** How many open sessions a dispatcher remembers, to check a command's caller without reading the bucket. */
const MAX_KNOWN = 10_000;

export class SessionDesk {
  /**
   * Open sessions this dispatcher has read, by id, oldest first. A session's owner and worker
   * never change, and whether it is still open is its worker's to say (it refuses a session it no
   * longer holds, and then the record is read again): a command costs no read of the bucket.
   */
  private readonly known = new Map<string, SessionRecord>();
  /** Sessions being opened through this dispatcher, by user: counted toward the quota. */
  private readonly opening = new Map<string, number>();

  constructor(
    private readonly topology: Topology,
    private readonly workers: WorkerDirectory,
    private readonly agentOf: (name: string) => Promise<AgentDefinition>,
    /** The system policy as this dispatcher holds it now (users' quotas). */
    private readonly policy: () => { policy: SystemPolicy },
  ) {}

  async open(request: OpenRequest, caller: Identity): Promise<SessionRecord> {
    // Counted while it opens, so that opens at once through this dispatcher cannot all pass the quota.
    await this.checkQuota(caller);
    this.opening.set(caller.user, (this.opening.get(caller.user) ?? 0) + 1);
    try {
      return await this.openChecked(request, caller);
    } finally {
      const left = (this.opening.get(caller.user) ?? 1) - 1;
      if (left > 0) this.opening.set(caller.user, left);
      else this.opening.delete(caller.user);
    }
  }

  private async openChecked(request: OpenRequest, caller: Identity): Promise<SessionRecord> {
    const snapshot = request.from === undefined ? undefined : await this.snapshot(request.from, caller);
    // A job of the caller's (another's is as not found, as with jobs.get): its stored artifacts.
    const job = request.artifactsOf === undefined ? undefined : await getRecord(this.topology, request.artifactsOf, caller);
    const agent = await this.agentOf(request.agent ?? (snapshot?.agent as string));
    if (!agent.sessions) {
      throw new BoxcarError(
        ErrorCode.forbidden,
        `agent ${agent.name} does not allow sessions: an admin sets \`sessions: true\` on it (docs/sessions.md)`,
      );
    }
    const template = request.template === undefined ? undefined : this.template(request.template, agent);
    const worker = this.workers.pickForSession(agent, agent.pool);
    const id = `ses-${Date.now().toString(36)}${randomBytes(6).toString("hex")}`;
    // A host sandbox runs commands as the worker's own user (its credential, other jobs' files):
    // only an admin may run commands of its own there, and only an admin's commands get the
    // agent's secrets. The worker holds to both.
    const asked = {
      id,
      owner: caller.user,
      request,
      agent,
      byAdmin: caller.role === "admin",
      ...(snapshot ? { from: snapshot.id } : {}),
      ...(job ? { artifacts: { job: job.id, files: job.artifacts } } : {}),
      ...(template ? { template } : {}),
    };
    return (await this.ask(worker.id, "open", asked, OPEN_TIMEOUT_MS)) as SessionRecord;
  }

  /**
   * The template `name` of the system policy, for a session of `agent`: refused (`invalid`) when
   * the policy has none of that name, or when the agent's sessions are not Docker ones (a template
   * is a Docker image). An agent whose sandbox is `auto` is left to its worker, which refuses it
   * there if it would not be Docker.
   */
  private template(name: string, agent: AgentDefinition): { name: string; image: string } {
    const templates = this.policy().policy.sessions.templates;
    const template = templates[name];
    if (!template) {
      const known = Object.keys(templates).sort();
      throw new BoxcarError(
        ErrorCode.invalid,
        `no session template ${name} (${known.length === 0 ? "the system policy allows none" : `known: ${known.join(", ")}`}; an admin sets them in the policy's sessions.templates)`,
      );
    }
    const kind = agent.runtime.sandbox;
    if (kind !== "docker" && kind !== "auto") {
      throw new BoxcarError(
        ErrorCode.invalid,
        `template ${name} is a Docker image, and agent ${agent.name}'s sessions run in ${kind} sandboxes: templates are for Docker sessions`,
      );
    }
    return { name, image: template.image };
  }

  /**
   * Refuses a new session to a caller who holds as many open as its quota allows (admins have
   * none). Counted from the sessions bucket (a session whose worker is gone does not count) and
   * the opens under way here, so two opens through two dispatchers at the same moment may both
   * pass, as with jobs' quotas.
   */
  private async checkQuota(caller: Identity): Promise<void> {
    if (caller.role === "admin") return;
    const most = quotaOf(this.policy().policy, caller.user).sessions;
    if (most === undefined) return;
    const open =
      (await this.list({ state: "open", limit: 1000 }, caller)).filter((s) => s.owner === caller.user).length +
      (this.opening.get(caller.user) ?? 0);
    if (open >= most) {
      throw new BoxcarError(
        ErrorCode.quotaExceeded,
        `${caller.user} has ${open} sessions open and a quota of ${most}: close one (boxcar sessions lists them), or ask an admin for a larger quota`,
      );
    }
  }

  /** Stores the session's workspace as a snapshot (its worker packs it, a container paused meanwhile). */
  async takeSnapshot(id: string, caller: Identity): Promise<SnapshotInfo> {
    const session = await this.usable(id, caller);
    const most = caller.role === "admin" ? undefined : quotaOf(this.policy().policy, caller.user).snapshots;
    if (most !== undefined) {
      const kept = (await this.snapshots(caller)).filter((s) => s.owner === caller.user).length;
      if (kept >= most) {
        throw new BoxcarError(
          ErrorCode.quotaExceeded,
          `${caller.user} keeps ${kept} snapshots and a quota of ${most}: remove some (boxcar snapshots rm), or ask an admin for a larger quota`,
        );
      }
    }
    return (await this.held(session, "snapshot", { id }, SNAPSHOT_TIMEOUT_MS)) as SnapshotInfo;
  }

  /** A snapshot the caller may use: its own (an admin: any); another's is as not found. */
  async snapshot(id: string, caller: Identity): Promise<SnapshotInfo> {
    const info = await (await this.topology.snapshots()).info(id);
    const snapshot = info && !info.deleted ? snapshotOf(info) : undefined;
    if (!snapshot || !(caller.role === "admin" || snapshot.owner === caller.user))
      throw new BoxcarError(ErrorCode.notFound, `no snapshot ${id}`);
    return snapshot;
  }

  /** The snapshots the caller may see, newest first. */
  async snapshots(caller: Identity): Promise<SnapshotInfo[]> {
    const all = await (await this.topology.snapshots()).list();
    return all
      .flatMap((info) => snapshotOf(info) ?? [])
      .filter((s) => mayAccess(caller, s.owner))
      .sort((a, b) => b.createdAt.localeCompare(a.createdAt));
  }

  async removeSnapshot(id: string, caller: Identity): Promise<SnapshotInfo> {
    const snapshot = await this.snapshot(id, caller);
    await (await this.topology.snapshots()).delete(id);
    return snapshot;
  }

  async exec(request: { id: string; timeout: number } & Record<string, unknown>, caller: Identity): Promise<ExecReply> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "exec", request, request.timeout + EXEC_GRACE_MS)) as ExecReply;
  }

  /** Starts a command in the session's background (docs/sessions.md#background-processes): the reply comes at once. */
  async start(request: { id: string }, caller: Identity): Promise<ApiReplyData<"sessions.start">> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "start", request, WORKER_ANSWER_MS)) as ApiReplyData<"sessions.start">;
  }

  /** The session's background processes, running and ended: for its owner, an admin, or a viewer. */
  async processes(id: string, caller: Identity): Promise<ApiReplyData<"sessions.processes">> {
    const session = await this.owned(id, caller);
    if (session.state !== "open") return { processes: [] };
    return (await this.held(session, "processes", { id }, WORKER_ANSWER_MS)) as ApiReplyData<"sessions.processes">;
  }

  /** Waits (up to its timeout) for a background process to end. */
  async wait(request: { id: string; timeout: number }, caller: Identity): Promise<ApiReplyData<"sessions.wait">> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "wait", request, request.timeout + WORKER_ANSWER_MS)) as ApiReplyData<"sessions.wait">;
  }

  /** Kills a background process (its whole process group). */
  async kill(request: { id: string }, caller: Identity): Promise<ApiReplyData<"sessions.kill">> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "kill", request, WORKER_ANSWER_MS)) as ApiReplyData<"sessions.kill">;
  }

  /** Writes to the stdin of a background process started with `openStdin`, and closes it if asked. */
  async input(request: { id: string }, caller: Identity): Promise<ApiReplyData<"sessions.input">> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "input", request, SLOW_ANSWER_MS)) as ApiReplyData<"sessions.input">;
  }

  /** Starts watching a path of the session's workspace: its changes are the session's `file_changed` events (docs/sessions.md#watch). */
  async watch(request: { id: string }, caller: Identity): Promise<ApiReplyData<"sessions.watch">> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "watch", request, SLOW_ANSWER_MS)) as ApiReplyData<"sessions.watch">;
  }

  async unwatch(request: { id: string }, caller: Identity): Promise<ApiReplyData<"sessions.unwatch">> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "unwatch", request, WORKER_ANSWER_MS)) as ApiReplyData<"sessions.unwatch">;
  }

  /**
   * Opens a connection to a port of the session's loopback (docs/sessions.md#ports), relayed by its
   * worker on the caller's own tunnel subjects (its name in them: only it, and admins, may use them).
   */
  async connect(request: { id: string }, caller: Identity): Promise<ApiReplyData<"sessions.connect">> {
    const session = await this.usable(request.id, caller);
    // The worker tries 127.0.0.1 then ::1, each for up to 10 s.
    return (await this.held(session, "connect", { ...request, user: caller.user }, WORKER_ANSWER_MS)) as ApiReplyData<"sessions.connect">;
  }

  /**
   * Starts a shell on a terminal in the session (docs/sessions.md#shell), a process of its
   * background whose terminal's bytes its worker relays on the caller's own tunnel subjects.
   */
  async shell(request: { id: string }, caller: Identity): Promise<ApiReplyData<"sessions.shell">> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "shell", { ...request, user: caller.user }, WORKER_ANSWER_MS)) as ApiReplyData<"sessions.shell">;
  }

  /**
   * A part of a command's whole output, kept when it wrote past the live window
   * (docs/sessions.md#whole-output): read from the Object Store here, a segment at a time.
   */
  async output(request: z.output<typeof OutputRequest>, caller: Identity): Promise<OutputReply> {
    await this.owned(request.id, caller);
    const { id, execId, stream, offset, length } = request;
    const sizes = await this.topology.artifacts.getBlob(keptOutputSizes(id, execId));
    const size = sizes ? (JSON.parse(new TextDecoder().decode(sizes)) as KeptOutput)[stream]?.bytes : undefined;
    if (size === undefined) {
      throw new BoxcarError(
        ErrorCode.notFound,
        `no kept ${stream} of ${execId}: a command's whole output is kept only when it wrote past the live window (4 MiB), until its session closes; below it, its live output is whole`,
      );
    }
    if (offset >= size) return { data: "", offset, size };
    const index = Math.floor(offset / SESSION_OUTPUT_SEGMENT);
    const info = await this.topology.artifacts.info(keptOutputObject(id, execId, stream, index));
    if (!info || info.deleted)
      throw new BoxcarError(ErrorCode.notFound, `segment ${index} of ${execId}'s ${stream} is gone (its session closed)`);
    // The segment's chunks read one by one (direct gets, as an artifact's are), from the one holding `offset`.
    const bucket = this.topology.names.buckets.artifacts;
    const chunks = `$O.${bucket}.C.${info.nuid}`;
    let skip = offset - index * SESSION_OUTPUT_SEGMENT;
    const parts: Uint8Array[] = [];
    let got = 0;
    for (let seq = 0; got < length; ) {
      const chunk = await this.topology.jsm.direct.getMessage(`OBJ_${bucket}`, { seq: seq + 1, next_by_subj: chunks }).catch(() => null);
      if (!chunk) break;
      seq = chunk.seq;
      if (skip >= chunk.data.length) {
        skip -= chunk.data.length;
        continue;
      }
      const part = chunk.data.subarray(skip, skip + (length - got));
      skip = 0;
      parts.push(part);
      got += part.length;
    }
    return { data: Buffer.concat(parts).toString("base64"), offset, size };
  }

  /**
   * Pauses the session (docs/sessions.md#pause): its worker holds every process of it still until
   * `resume`; its owner's (or an admin's), not a viewer's.
   */
  async pause(request: { id: string; timeout: number }, caller: Identity): Promise<SessionRecord> {
    const session = await this.usable(request.id, caller);
    return (await this.held(session, "pause", request, WORKER_ANSWER_MS)) as SessionRecord;
  }

  /** Lets a paused session's processes go on from where they were. */
  async resume(id: string, caller: Identity): Promise<SessionRecord> {
    const session = await this.usable(id, caller);
    return (await this.held(session, "resume", { id }, WORKER_ANSWER_MS)) as SessionRecord;
  }

  /** Stops the command running in the session; its `exec` answers with `cancelled`. */
  async cancel(id: string, caller: Identity): Promise<SessionRecord> {
    const session = await this.usable(id, caller);
    return (await this.held(session, "cancel", { id }, WORKER_ANSWER_MS)) as SessionRecord;
  }

  /** A file operation in the session's workspace, done by its worker (inside the container, for a Docker session). */
  async files<E extends keyof typeof FILE_OPERATIONS>(endpoint: E, request: { id: string }, caller: Identity): Promise<ApiReplyData<E>> {
    const session = await this.usable(request.id, caller);
    const hashing = endpoint === ApiEndpoint.sessionsFilesStat || endpoint === ApiEndpoint.sessionsFilesWrite;
    return (await this.held(
      session,
      FILE_OPERATIONS[endpoint],
      request,
      hashing ? HASHING_ANSWER_MS : WORKER_ANSWER_MS,
    )) as ApiReplyData<E>;
  }

  async close(id: string, caller: Identity): Promise<SessionRecord> {
    const session = await this.owned(id, caller);
    this.known.delete(id);
    if (session.state === "closed") return session;
    if (session.state === "lost") return this.markLost(session);
    return (await this.held(session, "close", { id }, WORKER_ANSWER_MS)) as SessionRecord;
  }

  /**
   * Where a job of `owner`'s for `agent` runs when it names session `id` (`submit --session`,
   * docs/sessions.md#jobs-in-a-session): the session, checked to be the owner's and open, and
   * the agent to be the session's or one that allows sessions. Another user's is as not found,
   * as for its other operations.
   */
  async forJob(id: string, owner: string, agent: AgentDefinition): Promise<{ id: string; workerId: string; pool: string }> {
    const session = await this.usable(id, { role: "submitter", user: owner });
    // The job runs with the session's sandbox as it is (its image, limits, network and secrets):
    // another agent's job may run there only if that agent allows sessions too.
    if (session.agent !== agent.name && !agent.sessions) {
      throw new BoxcarError(
        ErrorCode.forbidden,
        `agent ${agent.name} does not allow sessions, so it cannot run in session ${id} (of agent ${session.agent}): an admin sets \`sessions: true\` on it`,
        { issues: [{ path: "session", message: `agent ${agent.name} does not allow sessions` }] },
      );
    }
    if (this.workers.statusOf(session.workerId) === "draining") {
      throw new BoxcarError(
        ErrorCode.conflict,
        `the worker holding session ${id} (${session.workerId}) is stopping: its sessions close with it`,
      );
    }
    if (!this.workers.takesSessionJobs(session.workerId)) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `the worker holding session ${id} (${session.workerId}) is of a release that runs no jobs in sessions: open one on a newer worker`,
      );
    }
    return { id, workerId: session.workerId, pool: session.pool };
  }

  /** Asks the session's worker; one that no longer holds it (it restarted) makes the record say so. */
  private async held(session: SessionRecord, op: string, body: unknown, timeoutMs: number): Promise<unknown> {
    try {
      return await this.ask(session.workerId, op, body, timeoutMs);
    } catch (err) {
      if (!(err instanceof NotHeld)) throw err;
      this.known.delete(session.id);
      // Closed meanwhile (through another dispatcher, or by its bounds), or lost with a restarted worker.
      const now = (await getJson(await this.topology.sessions(), session.id, SessionRecordSchema, "session"))?.value ?? session;
      const ended = now.state === "closed" ? now : await this.markLost(now);
      throw new BoxcarError(ErrorCode.conflict, `session ${session.id} is ${ended.state}: ${ended.reason}`);
    }
  }

  /** Writes a session whose worker no longer holds it as closed, `lost`. */
  private async markLost(session: SessionRecord): Promise<SessionRecord> {
    const closed: SessionRecord = {
      ...session,
      state: "closed",
      closedAt: new Date().toISOString(),
      reason: "lost: its worker no longer holds it",
    };
    await (await this.topology.sessions()).put(session.id, JSON.stringify(closed));
    return closed;
  }

  /** The record, `lost` when its worker is gone. */
  async get(id: string, caller: Identity): Promise<SessionRecord> {
    return this.owned(id, caller);
  }

  async list(request: { state?: SessionState | undefined; limit: number }, caller: Identity): Promise<SessionRecord[]> {
    const all = await listJson(await this.topology.sessions(), SessionRecordSchema, "session");
    return all
      .map((s) => this.withWorker(s))
      .filter((s) => mayAccess(caller, s.owner) && (request.state === undefined || s.state === request.state))
      .sort((a, b) => b.createdAt.localeCompare(a.createdAt))
      .slice(0, request.limit);
  }

  /** The session, if the caller may see it; another user's is as not found (as jobs are). */
  private async owned(id: string, caller: Identity): Promise<SessionRecord> {
    const found = await getJson(await this.topology.sessions(), id, SessionRecordSchema, "session");
    if (!found || !mayAccess(caller, found.value.owner)) throw new BoxcarError(ErrorCode.notFound, `no session ${id}`);
    return this.withWorker(found.value);
  }

  /** An open session the caller may use: its own (an admin: any). */
  private async usable(id: string, caller: Identity): Promise<SessionRecord> {
    const known = this.known.get(id);
    const session = known && mayAccess(caller, known.owner) ? this.withWorker(known) : await this.owned(id, caller);
    if (caller.role !== "admin" && session.owner !== caller.user) {
      throw new BoxcarError(ErrorCode.forbidden, `session ${id} is ${session.owner}'s: only its owner (or an admin) may use it`);
    }
    if (session.state !== "open") {
      this.known.delete(id);
      throw new BoxcarError(ErrorCode.conflict, `session ${id} is ${session.state}${session.reason ? ` (${session.reason})` : ""}`);
    }
    if (!known) {
      this.known.set(id, session);
      if (this.known.size > MAX_KNOWN) this.known.delete(this.known.keys().next().value as string);
    }
    return session;
  }

  private withWorker(session: SessionRecord): SessionRecord {
    if (session.state !== "open") return session;
    const status = this.workers.statusOf(session.workerId);
    return status === "live" || status === "draining"
      ? session
      : { ...session, state: "lost", reason: `worker ${session.workerId} is gone` };
  }

  /** Asks the worker; its refusal comes back as the error it gave. */
  private async ask(workerId: string, op: string, body: unknown, timeoutMs: number): Promise<unknown> {
    let text: string;
    try {
      const msg = await this.topology.nc.request(this.topology.names.subjects.session(workerId, op), JSON.stringify(body), {
        timeout: timeoutMs,
      });
      text = msg.string();
    } catch (err) {
      throw new BoxcarError(ErrorCode.unavailable, `worker ${workerId} did not answer (${op}): ${(err as Error).message}`);
    }
    const reply = WorkerReply.parse(JSON.parse(text));
    if (reply.ok) return reply.data;
    if (reply.held === false) throw new NotHeld(reply.error.message);
    throw new BoxcarError(reply.error.code as ErrorCode, reply.error.message);
  }
}

/** The worker asked does not hold the session (it restarted). */
class NotHeld extends BoxcarError {
  constructor(message: string) {
    super(ErrorCode.notFound, message);
  }
}
