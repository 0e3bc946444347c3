import { createHash } from "node:crypto";
import { mkdir, open, rm } from "node:fs/promises";
import { dirname, join, resolve, sep } from "node:path";
import { TRACEPARENT, traceparentOf } from "@boxcar/common";
import {
  type AgentDefinition,
  API_CONTRACT,
  ApiEndpoint,
  ApiReply,
  type ApiReplyData,
  BoxcarError,
  type BoxcarEvent,
  type CleanJobsReply,
  type CleanJobsRequest,
  type CountJobsReply,
  type CountJobsRequest,
  ErrorCode,
  type EventsPage,
  type ExecReply,
  type ExecRequestInput,
  type Identity,
  type InputFileRef,
  isTerminal,
  type JobRecord,
  type JobSpecInput,
  type ListJobsRequest,
  type ListRunsReply,
  type ListRunsRequest,
  type ListSessionFilesInput,
  type ListSessionsRequestInput,
  type LogStream,
  type LogsPage,
  OPEN_IDENTITY,
  type OpenSessionRequestInput,
  ownerOf,
  parseDurationMs,
  parseWith,
  type RunSignalReply,
  type ScheduleDefinitionInput,
  type ScheduleRecord,
  type SessionRecord,
  type SetPolicyReply,
  type SignalRequest,
  type SnapshotInfo,
  type StartRunRequest,
  type SystemPolicy,
  type SystemPolicyInput,
  UPLOAD_END_HEADER,
  UploadDone,
  type UsageReply,
  type WorkerInfo,
  type WorkflowRun,
} from "@boxcar/protocol";
import { errors as natsErrors, headers as natsHeaders } from "@nats-io/transport-node";
import { z } from "zod";
import {
  type ClientLink,
  followChain,
  followJob,
  followRun,
  type HistoryReader,
  jobEventSubjects,
  waitForChainEnd,
  waitForJobRecord,
  waitForRunEnd,
} from "./chain-events.js";
import { type FollowOptions, followPages, type HistoryPage } from "./follow.js";

export interface ClientOptions {
  /** How long to wait for a dispatcher's reply; default 10 s. */
  requestTimeoutMs?: number;
  /**
   * Who the client asks as: the role and user of its NATS credential (`connectNats` reads them
   * from it). Default: an admin named `local`, what any caller of a server without
   * authentication is.
   */
  identity?: Identity;
}

export interface LogChunk {
  stream: LogStream;
  data: Uint8Array;
}

/** A local file to put in the job's workspace at `path`. */
export interface LocalInputFile {
  localPath: string;
  path: string;
}

export interface SubmitOptions {
  /**
   * Local files to upload to the Object Store first (claim-check). They are removed again when
   * the submission is refused or returns an earlier job for the same idempotency key.
   */
  upload?: readonly LocalInputFile[];
}

export interface JobEventsOptions extends FollowOptions {
  /** Also the events of the jobs this one hands off to, in chain order. */
  chain?: boolean;
}

/** How long a client waits for a session to open, and beyond an exec's timeout for its answer. */
const SESSION_OPEN_WAIT_MS = 150_000;
const SESSION_EXEC_MARGIN_MS = 45_000;

/** Submits and watches jobs, manages agents, reads results and artifacts. */
export interface BoxcarClient {
  submit(spec: JobSpecInput, opts?: SubmitOptions): Promise<{ job: JobRecord; duplicate: boolean }>;
  /** Puts a local file in the Object Store and returns the reference a job spec carries. */
  uploadInput(localPath: string, workspacePath: string): Promise<InputFileRef>;
  getJob(id: string): Promise<JobRecord>;
  listJobs(request?: ListJobsRequest): Promise<{ jobs: JobRecord[]; next?: string }>;
  cancelJob(id: string): Promise<JobRecord>;
  /** Runs a dead job again, with a fresh budget of attempts. */
  retryJob(id: string): Promise<JobRecord>;
  /** Sends a signal to a job: a file in its workspace and an event, now or (queued: `kept`) when it starts; where (docs/flow-control.md#signals). */
  signalJob(id: string, name: string, payload?: unknown): Promise<{ job: JobRecord; file: string; kept?: true }>;
  /** Sends a signal to each job of a workflow run running or queued now. */
  signalRun(id: string, name: string, payload?: unknown): Promise<RunSignalReply>;
  /** Deletes now the ended jobs that match, as retention would (admins only); ask again while `more`. */
  cleanJobs(request: CleanJobsRequest): Promise<CleanJobsReply>;
  /** How many of the jobs you may see are in each state (all of them, or one agent's). */
  countJobs(request?: CountJobsRequest): Promise<CountJobsReply>;
  /** Resolves with the job's record once it reaches a final state. */
  waitForJob(id: string, signal?: AbortSignal): Promise<JobRecord>;
  /** The job's events in order; with `follow`, until its final event (with `chain`, the chain's). */
  events(jobId: string, opts?: JobEventsOptions): AsyncGenerator<BoxcarEvent>;
  /** Resolves with the last job of the handoff chain `jobId` starts, once the chain has ended. */
  waitForChain(jobId: string, signal?: AbortSignal): Promise<JobRecord>;
  /** Starts a workflow run; `workflow` is a definition as in a workflow file. */
  startRun(request: StartRunRequest): Promise<{ run: WorkflowRun; duplicate: boolean }>;
  getRun(id: string): Promise<WorkflowRun>;
  /** The first page of runs (newest first); `listRunsPage` gives the cursor to the next. */
  listRuns(request?: ListRunsRequest): Promise<WorkflowRun[]>;
  /** One page of runs, newest first; with `after` (`""` for the first page), `next` to pass as `after` when there are more. */
  listRunsPage(request?: ListRunsRequest): Promise<ListRunsReply>;
  cancelRun(id: string): Promise<WorkflowRun>;
  /** Approves or rejects a run's approval step, as one of its approvers (docs/workflows.md#approvals). */
  decideStep(id: string, step: string, decision: "approve" | "reject", comment?: string): Promise<WorkflowRun>;
  /** Resolves with the run once it has ended and none of its jobs is still going. */
  waitForRun(id: string, signal?: AbortSignal): Promise<WorkflowRun>;
  /** The run's events and its jobs' events in order; with `follow`, until the run has ended and none of its jobs is still going. */
  runEvents(runId: string, opts?: FollowOptions): AsyncGenerator<BoxcarEvent>;
  /** The job's output in order; with `follow`, until the job is final and its output is read. */
  logs(jobId: string, opts?: FollowOptions): AsyncGenerator<LogChunk>;
  /** Downloads the job's artifacts under `dir`; returns the paths written. */
  downloadArtifacts(jobId: string, dir: string): Promise<string[]>;
  applyAgent(definition: unknown): Promise<{ agent: AgentDefinition; created: boolean }>;
  getAgent(name: string): Promise<AgentDefinition>;
  listAgents(): Promise<AgentDefinition[]>;
  removeAgent(name: string): Promise<void>;
  listWorkers(): Promise<WorkerInfo[]>;
  /** Opens a session (docs/sessions.md): a sandbox for the agent's runtime, kept between commands, yours only. */
  openSession(request: OpenSessionRequestInput): Promise<SessionRecord>;
  /** Runs one command in the session and waits for it; its output also goes live to the session's log subjects. */
  execInSession(request: ExecRequestInput): Promise<ExecReply>;
  /** Stops the command running in the session (its `execInSession` answers with `cancelled`). */
  cancelInSession(id: string): Promise<SessionRecord>;
  /** A file of the session's workspace (at most 512 KiB). */
  readSessionFile(id: string, path: string): Promise<Uint8Array>;
  /** Writes a file in the session's workspace (at most 512 KiB), making its folders; it replaces what was there (`executable`: mode 0755). */
  writeSessionFile(
    id: string,
    path: string,
    data: Uint8Array | string,
    opts?: { executable?: boolean },
  ): Promise<{ path: string; size: number }>;
  /** The regular files of the session's workspace, or of one folder of it. */
  listSessionFiles(request: ListSessionFilesInput): Promise<{ files: Array<{ path: string; size: number }>; truncated: boolean }>;
  /** Removes a file or folder of the session's workspace; false when there was none. */
  removeSessionFile(id: string, path: string): Promise<boolean>;
  /** Stores the session's workspace (folders and regular files) as a snapshot, which `openSession({ from })` starts a session with. */
  snapshotSession(id: string): Promise<SnapshotInfo>;
  /** Your snapshots (a viewer or an admin: everyone's), newest first. */
  listSnapshots(): Promise<SnapshotInfo[]>;
  removeSnapshot(id: string): Promise<SnapshotInfo>;
  closeSession(id: string): Promise<SessionRecord>;
  getSession(id: string): Promise<SessionRecord>;
  listSessions(request?: ListSessionsRequestInput): Promise<SessionRecord[]>;
  /** A session's events, in order; with `follow`, also those to come, until it closes. */
  sessionEvents(id: string, opts?: FollowOptions): AsyncGenerator<BoxcarEvent>;
  /** A session's output (the first 4 MiB of each command's), in order; with `follow`, also what comes, until it closes. */
  sessionLogs(id: string, opts?: FollowOptions): AsyncGenerator<LogChunk>;
  /** The admin's system policy: what agents may ask for, and users' quotas. */
  getPolicy(): Promise<SystemPolicy>;
  /** Replaces the system policy (admins only); says which applied agents it refuses. */
  setPolicy(policy: SystemPolicyInput): Promise<SetPolicyReply>;
  /** Creates a schedule (docs/flow-control.md#schedules): its job is submitted, as yours, at each tick of its cron. */
  createSchedule(definition: ScheduleDefinitionInput): Promise<ScheduleRecord>;
  /** Replaces the definition of your schedule of that name, keeping its history; it catches up no tick from before. */
  updateSchedule(definition: ScheduleDefinitionInput): Promise<ScheduleRecord>;
  /** One of your schedules, with when it fires next; an admin may name another user's (`owner`). */
  getSchedule(name: string, owner?: string): Promise<ScheduleRecord>;
  /** The schedules you may see. */
  listSchedules(): Promise<ScheduleRecord[]>;
  /** A day's usage (UTC, `YYYY-MM-DD`; default today) per agent and per user, as agents reported it: yours only, unless you are a viewer or an admin. */
  getUsage(day?: string): Promise<UsageReply>;
  /** Stops a schedule's ticks until it is resumed. */
  pauseSchedule(name: string, owner?: string): Promise<ScheduleRecord>;
  /** Starts a paused schedule's ticks again; those missed while it was paused are not caught up. */
  resumeSchedule(name: string, owner?: string): Promise<ScheduleRecord>;
  /** Removes a schedule; returns it as it was. */
  deleteSchedule(name: string, owner?: string): Promise<ScheduleRecord>;
}

/**
 * A client of the Boxcar system `link` reaches. Everything goes through the dispatchers' API
 * (and live follows through core subscriptions to the caller's own events): a client needs no
 * JetStream access, and so works with a submitter's or viewer's credential. A `Topology` is a
 * `ClientLink`.
 */
export function createClient(link: ClientLink, opts: ClientOptions = {}): BoxcarClient {
  return new Client({ nc: link.nc, names: link.names }, opts.requestTimeoutMs ?? 10_000, opts.identity ?? OPEN_IDENTITY);
}

/** The largest chunk of an input file sent in one message (the server's limit is usually 1 MiB). */
const UPLOAD_CHUNK_BYTES = 128 * 1024;

class Client implements BoxcarClient, HistoryReader {
  constructor(
    private readonly link: ClientLink,
    private readonly timeoutMs: number,
    private readonly identity: Identity,
  ) {}

  /**
   * Asks an endpoint and reads its reply's data with the endpoint's schema in `API_CONTRACT`;
   * the caller's active trace, if any, goes along (`traceparent`), so the dispatcher's span joins it.
   */
  private async request<E extends ApiEndpoint>(endpoint: E, body: unknown, timeoutMs = this.timeoutMs): Promise<ApiReplyData<E>> {
    const traceparent = traceparentOf();
    const headers = traceparent ? natsHeaders() : undefined;
    if (traceparent) headers?.set(TRACEPARENT, traceparent);
    const schema = API_CONTRACT[endpoint].reply as unknown as z.ZodType<ApiReplyData<E>>;
    return this.ask(this.link.names.subjects.api(this.identity, endpoint), JSON.stringify(body), schema, headers, timeoutMs);
  }

  /** Sends a request and reads the `{ ok, data }` reply; NATS's errors become Boxcar's. */
  private async ask<S extends z.ZodType>(
    subject: string,
    body: string | Uint8Array,
    schema: S,
    headers?: ReturnType<typeof natsHeaders>,
    timeoutMs = this.timeoutMs,
  ): Promise<z.infer<S>> {
    let reply: Uint8Array;
    try {
      const msg = await this.link.nc.request(subject, body, { timeout: timeoutMs, ...(headers ? { headers } : {}) });
      reply = msg.data;
    } catch (err) {
      if (err instanceof natsErrors.NoRespondersError || (err instanceof natsErrors.RequestError && err.isNoResponders())) {
        throw new BoxcarError(
          ErrorCode.unavailable,
          `no dispatcher answers on ${subject}: is one running, with prefix ${this.link.names.prefix}?`,
          { cause: err },
        );
      }
      const denied = err instanceof natsErrors.PermissionViolationError ? err : (err as Error).cause;
      if (denied instanceof natsErrors.PermissionViolationError) {
        throw new BoxcarError(
          ErrorCode.forbidden,
          `NATS refused ${subject}: the credential of ${this.identity.role} ${this.identity.user} may not publish there`,
          { cause: err },
        );
      }
      if (err instanceof natsErrors.TimeoutError) {
        throw new BoxcarError(ErrorCode.unavailable, `no reply on ${subject} within ${this.timeoutMs} ms`, { cause: err });
      }
      throw err;
    }
    const parsed = parseWith(ApiReply, JSON.parse(new TextDecoder().decode(reply)), `reply from ${subject}`);
    if (!parsed.ok) throw BoxcarError.fromInfo(parsed.error);
    return parseWith(schema, parsed.data, `reply from ${subject}`);
  }

  async submit(spec: JobSpecInput, opts: SubmitOptions = {}) {
    // A refused submission removes the files uploaded for it (the dispatcher does).
    const uploaded: InputFileRef[] = [];
    for (const file of opts.upload ?? []) uploaded.push(await this.uploadInput(file.localPath, file.path));
    return this.request(ApiEndpoint.jobsSubmit, { ...spec, files: [...(spec.files ?? []), ...uploaded] });
  }

  async uploadInput(localPath: string, workspacePath: string): Promise<InputFileRef> {
    const file = await open(localPath);
    try {
      const upload = await this.request(ApiEndpoint.inputsUpload, { path: workspacePath });
      const buffer = new Uint8Array(UPLOAD_CHUNK_BYTES);
      let size = 0;
      for (;;) {
        const { bytesRead } = await file.read(buffer, 0, buffer.length, null);
        size += bytesRead;
        if (bytesRead === buffer.length) {
          await this.ask(upload.subject, buffer, z.unknown());
          continue;
        }
        const end = natsHeaders();
        end.set(UPLOAD_END_HEADER, String(size));
        await this.ask(upload.subject, buffer.subarray(0, bytesRead), UploadDone, end);
        return { path: workspacePath, object: upload.object };
      }
    } finally {
      await file.close();
    }
  }
  async getJob(id: string) {
    return (await this.request(ApiEndpoint.jobsGet, { id })).job;
  }

  listJobs(request: ListJobsRequest = {}) {
    return this.request(ApiEndpoint.jobsList, request);
  }

  async cancelJob(id: string) {
    return (await this.request(ApiEndpoint.jobsCancel, { id })).job;
  }

  signalJob(id: string, name: string, payload: unknown = null) {
    return this.request(ApiEndpoint.jobsSignal, { id, name, payload: payload as SignalRequest["payload"] });
  }

  signalRun(id: string, name: string, payload: unknown = null) {
    return this.request(ApiEndpoint.workflowsSignal, { id, name, payload: payload as SignalRequest["payload"] });
  }

  async retryJob(id: string) {
    return (await this.request(ApiEndpoint.jobsRetry, { id })).job;
  }

  countJobs(request: CountJobsRequest = {}) {
    return this.request(ApiEndpoint.jobsCount, request);
  }

  cleanJobs(request: CleanJobsRequest) {
    return this.request(ApiEndpoint.jobsClean, request);
  }

  async waitForJob(id: string, signal?: AbortSignal): Promise<JobRecord> {
    // Listens before the one read: a submitter hears only its own jobs' events, others anyone's.
    const owner = this.identity.role === "submitter" ? this.identity.user : "*";
    return waitForJobRecord(this.link, this, { id, owner }, (job) => isTerminal(job.state), signal);
  }

  async *events(jobId: string, opts: JobEventsOptions = {}): AsyncGenerator<BoxcarEvent> {
    // Asking for the job checks the caller may see it; its owner is in its events' subjects.
    const job = await this.getJob(jobId);
    yield* opts.chain ? followChain(this.link, this, job, opts) : followJob(this.link, this, job, opts);
  }

  async jobEventsPage(id: string, after: number): Promise<HistoryPage<BoxcarEvent>> {
    return eventsPage(await this.request(ApiEndpoint.jobsEvents, { id, after }));
  }

  async runEventsPage(id: string, after: number): Promise<HistoryPage<BoxcarEvent>> {
    return eventsPage(await this.request(ApiEndpoint.workflowsEvents, { id, after }));
  }

  async *logs(jobId: string, opts: FollowOptions = {}): AsyncGenerator<LogChunk> {
    const job = await this.getJob(jobId);
    const owner = ownerOf(job);
    const { names } = this.link;
    let final = isTerminal(job.state);
    const read = async (after: number) => logsPage(await this.request(ApiEndpoint.jobsLogs, { id: jobId, after }));
    yield* followPages(this.link.nc, read, {
      ...opts,
      // New output, and the job's final event: the worker stores all output before the final record.
      live: [names.subjects.jobLogs(owner, jobId), jobEventSubjects(names, owner, jobId)],
      finished: async () => {
        // Once the job is final, one more read takes what is left.
        if (final) return true;
        final = isTerminal((await this.getJob(jobId)).state);
        return false;
      },
    });
  }

  async downloadArtifacts(jobId: string, dir: string): Promise<string[]> {
    const job = await this.getJob(jobId);
    const root = resolve(dir);
    const written: string[] = [];
    for (const artifact of job.artifacts) {
      const target = resolve(join(root, artifact.path));
      if (!target.startsWith(root + sep)) throw new BoxcarError(ErrorCode.invalid, `artifact path escapes ${dir}: ${artifact.path}`);
      await mkdir(dirname(target), { recursive: true });
      const file = await open(target, "w");
      try {
        await this.downloadArtifact(jobId, artifact.path, file);
      } catch (err) {
        await file.close();
        await rm(target, { force: true });
        throw err;
      }
      await file.close();
      written.push(target);
    }
    return written;
  }

  /** Writes one artifact to `file` a chunk at a time, and checks its size and digest. */
  private async downloadArtifact(jobId: string, path: string, file: import("node:fs/promises").FileHandle): Promise<void> {
    const hash = createHash("sha256");
    let received = 0;
    for (let after = 0; ; ) {
      const chunk = await this.request(ApiEndpoint.jobsArtifact, { id: jobId, path, after });
      const data = Buffer.from(chunk.data, "base64");
      hash.update(data);
      await file.write(data);
      received += data.length;
      after = chunk.last;
      if (received >= chunk.size || !chunk.more) {
        if (received !== chunk.size || !sameDigest(chunk.digest, hash.digest())) {
          throw new BoxcarError(
            ErrorCode.internal,
            `artifact ${path} of job ${jobId} arrived incomplete (${received} of ${chunk.size} bytes)`,
          );
        }
        return;
      }
    }
  }

  applyAgent(definition: unknown) {
    return this.request(ApiEndpoint.agentsApply, { definition });
  }

  async getAgent(name: string) {
    return (await this.request(ApiEndpoint.agentsGet, { name })).agent;
  }

  async listAgents() {
    return (await this.request(ApiEndpoint.agentsList, {})).agents;
  }

  async removeAgent(name: string) {
    await this.request(ApiEndpoint.agentsRemove, { name });
  }

  async listWorkers() {
    return (await this.request(ApiEndpoint.workersList, {})).workers;
  }

  async openSession(request: OpenSessionRequestInput) {
    // A worker may pull an image to open one.
    return (await this.request(ApiEndpoint.sessionsOpen, request, Math.max(this.timeoutMs, SESSION_OPEN_WAIT_MS))).session;
  }

  execInSession(request: ExecRequestInput) {
    // As long as the command may run (its timeout, 10 minutes by default), and a margin.
    const runs = (typeof request.timeout === "number" ? request.timeout : parseDurationMs(request.timeout ?? "10m")) ?? 600_000;
    return this.request(ApiEndpoint.sessionsExec, request, Math.max(this.timeoutMs, runs + SESSION_EXEC_MARGIN_MS));
  }

  async cancelInSession(id: string) {
    return (await this.request(ApiEndpoint.sessionsCancel, { id })).session;
  }

  async readSessionFile(id: string, path: string) {
    return Buffer.from((await this.request(ApiEndpoint.sessionsFilesRead, { id, path })).data, "base64");
  }

  writeSessionFile(id: string, path: string, data: Uint8Array | string, opts: { executable?: boolean } = {}) {
    const body = { id, path, data: Buffer.from(data).toString("base64"), ...(opts.executable ? { executable: true } : {}) };
    return this.request(ApiEndpoint.sessionsFilesWrite, body);
  }

  listSessionFiles(request: ListSessionFilesInput) {
    return this.request(ApiEndpoint.sessionsFilesList, request);
  }

  async removeSessionFile(id: string, path: string) {
    return (await this.request(ApiEndpoint.sessionsFilesRemove, { id, path })).removed;
  }

  async snapshotSession(id: string) {
    // Packing and storing up to a workspace's 1 GiB takes a while.
    return (await this.request(ApiEndpoint.sessionsSnapshot, { id }, Math.max(this.timeoutMs, SESSION_OPEN_WAIT_MS * 4))).snapshot;
  }

  async listSnapshots() {
    return (await this.request(ApiEndpoint.snapshotsList, {})).snapshots;
  }

  async removeSnapshot(id: string) {
    return (await this.request(ApiEndpoint.snapshotsRemove, { id })).snapshot;
  }

  async closeSession(id: string) {
    return (await this.request(ApiEndpoint.sessionsClose, { id })).session;
  }

  async getSession(id: string) {
    return (await this.request(ApiEndpoint.sessionsGet, { id })).session;
  }

  async listSessions(request: ListSessionsRequestInput = {}) {
    return (await this.request(ApiEndpoint.sessionsList, request)).sessions;
  }

  async *sessionEvents(id: string, opts: FollowOptions = {}) {
    const read = async (after: number) => eventsPage(await this.request(ApiEndpoint.sessionsEvents, { id, after }));
    yield* followPages(this.link.nc, read, await this.followSession(id, opts));
  }

  async *sessionLogs(id: string, opts: FollowOptions = {}) {
    const read = async (after: number) => logsPage(await this.request(ApiEndpoint.sessionsLogs, { id, after }));
    yield* followPages(this.link.nc, read, await this.followSession(id, opts));
  }

  /** How to follow a session's history: woken by its events and output, over once it is no longer open (one more read takes what is left). */
  private async followSession(id: string, opts: FollowOptions) {
    if (!opts.follow) return { ...opts, live: [] };
    const { names } = this.link;
    const { owner, state } = await this.getSession(id);
    let over = state !== "open";
    return {
      ...opts,
      live: [names.subjects.event("session", id, "*", owner), names.subjects.jobLogs(owner, id)],
      finished: async () => {
        if (over) return true;
        over = (await this.getSession(id)).state !== "open";
        return false;
      },
    };
  }

  async getPolicy() {
    return (await this.request(ApiEndpoint.policyGet, {})).policy;
  }

  setPolicy(policy: SystemPolicyInput) {
    return this.request(ApiEndpoint.policySet, { policy });
  }

  async createSchedule(definition: ScheduleDefinitionInput) {
    return (await this.request(ApiEndpoint.schedulesCreate, { definition })).schedule;
  }

  async updateSchedule(definition: ScheduleDefinitionInput) {
    return (await this.request(ApiEndpoint.schedulesUpdate, { definition })).schedule;
  }

  async getSchedule(name: string, owner?: string) {
    return (await this.request(ApiEndpoint.schedulesGet, scheduleRef(name, owner))).schedule;
  }

  async listSchedules() {
    return (await this.request(ApiEndpoint.schedulesList, {})).schedules;
  }

  getUsage(day?: string) {
    return this.request(ApiEndpoint.usageGet, day === undefined ? {} : { day });
  }

  async pauseSchedule(name: string, owner?: string) {
    return (await this.request(ApiEndpoint.schedulesPause, scheduleRef(name, owner))).schedule;
  }

  async resumeSchedule(name: string, owner?: string) {
    return (await this.request(ApiEndpoint.schedulesResume, scheduleRef(name, owner))).schedule;
  }

  async deleteSchedule(name: string, owner?: string) {
    return (await this.request(ApiEndpoint.schedulesDelete, scheduleRef(name, owner))).schedule;
  }

  waitForChain(jobId: string, signal?: AbortSignal) {
    return waitForChainEnd(this.link, this, jobId, signal);
  }

  startRun(request: StartRunRequest) {
    return this.request(ApiEndpoint.workflowsStart, request);
  }

  async getRun(id: string) {
    return (await this.request(ApiEndpoint.workflowsGet, { id })).run;
  }

  async listRuns(request: ListRunsRequest = {}) {
    return (await this.listRunsPage(request)).runs;
  }

  async listRunsPage(request: ListRunsRequest = {}) {
    return this.request(ApiEndpoint.workflowsList, request);
  }

  async cancelRun(id: string) {
    return (await this.request(ApiEndpoint.workflowsCancel, { id })).run;
  }

  async decideStep(id: string, step: string, decision: "approve" | "reject", comment?: string) {
    return (await this.request(ApiEndpoint.workflowsApprove, { id, step, decision, ...(comment !== undefined ? { comment } : {}) })).run;
  }

  waitForRun(id: string, signal?: AbortSignal) {
    return waitForRunEnd(this.link, this, id, signal);
  }

  async *runEvents(runId: string, opts: FollowOptions = {}) {
    yield* followRun(this.link, this, await this.getRun(runId), opts);
  }
}

/** A schedules request's `{ name, owner? }`: the caller's own schedule unless `owner` names another's. */
const scheduleRef = (name: string, owner?: string) => ({ name, ...(owner !== undefined ? { owner } : {}) });

const eventsPage = (page: EventsPage): HistoryPage<BoxcarEvent> => ({
  items: page.events,
  last: page.last,
  more: page.more,
});

/** A page of output (a job's or a session's), its chunks as bytes. */
const logsPage = (page: LogsPage): HistoryPage<LogChunk> => ({
  items: page.chunks.map((c) => ({ stream: c.stream as LogStream, data: new Uint8Array(Buffer.from(c.data, "base64")) })),
  last: page.last,
  more: page.more,
});

/** Whether an Object Store digest (`SHA-256=` and the hash in base64, URL-safe or not, padded or not) is `sha256`. */
function sameDigest(digest: string, sha256: Buffer): boolean {
  const normal = (b64: string) => b64.replaceAll("-", "+").replaceAll("_", "/").replace(/=+$/, "");
  return digest.startsWith("SHA-256=") && normal(digest.slice(8)) === normal(sha256.toString("base64"));
}
