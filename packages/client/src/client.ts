/**
 * The SDK's client (`createClient`): each of `BoxcarClient`'s methods (boxcar-client.ts) as a
 * request to the dispatchers' API (dispatcher-api.ts), with how long a session's requests may
 * take; waiting for and following jobs, runs and sessions (with chain-events.ts and follow.ts);
 * files to and from the system in file-transfers.ts.
 */

import {
  ApiEndpoint,
  type BoxcarEvent,
  type CleanJobsRequest,
  type CountJobsRequest,
  type EventsPage,
  type ExecRequestInput,
  type InputFileRef,
  isTerminal,
  type JobRecord,
  type JobSpecInput,
  type ListJobsRequest,
  type ListRunsRequest,
  type ListSessionFilesInput,
  type ListSessionsRequestInput,
  type LogStream,
  type LogsPage,
  OPEN_IDENTITY,
  type OpenSessionRequestInput,
  type OutputRequestInput,
  ownerOf,
  parseDurationMs,
  type ReadSessionFileInput,
  type ScheduleDefinitionInput,
  type SignalRequest,
  type StartRequestInput,
  type StartRunRequest,
  type SystemPolicyInput,
  type WaitRequestInput,
  type WatchRequestInput,
} from "@boxcar/protocol";
import type { BoxcarClient, ClientOptions, JobEventsOptions, LogChunk, SubmitOptions } from "./boxcar-client.js";
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
import { DispatcherApi } from "./dispatcher-api.js";
import { downloadArtifacts, uploadInput } from "./file-transfers.js";
import { type FollowOptions, followPages, type HistoryPage } from "./follow.js";
import { connectTunnel, forwardPort, type PortForwardOptions } from "./session-ports.js";
import { openShell, type ShellOptions } from "./session-shell.js";
import { type CopyOptions, copyFromSession, copyToSession, HASHING_WAIT_MS } from "./session-transfers.js";

/** How long a client waits for a session to open, and beyond an exec's timeout for its answer. */
const SESSION_OPEN_WAIT_MS = 150_000;
const SESSION_EXEC_MARGIN_MS = 45_000;

/**
 * A client of the Boxcar system `link` reaches. Everything goes through the dispatchers' API
 * (and live follows through core subscriptions to the caller's own events): a client needs no
 * JetStream access, and so works with a submitter's or viewer's credential. A `Topology` is a
 * `ClientLink`.
 */
export function createClient(link: ClientLink, opts: ClientOptions = {}): BoxcarClient {
  const own = { nc: link.nc, names: link.names };
  return new Client(own, new DispatcherApi(own, opts.requestTimeoutMs ?? 10_000, opts.identity ?? OPEN_IDENTITY));
}

class Client implements BoxcarClient, HistoryReader {
  constructor(
    private readonly link: ClientLink,
    private readonly api: DispatcherApi,
  ) {}

  async submit(spec: JobSpecInput, opts: SubmitOptions = {}) {
    // A refused submission removes the files uploaded for it (the dispatcher does).
    const uploaded: InputFileRef[] = [];
    for (const file of opts.upload ?? []) uploaded.push(await this.uploadInput(file.localPath, file.path));
    return this.api.request(ApiEndpoint.jobsSubmit, { ...spec, files: [...(spec.files ?? []), ...uploaded] });
  }

  uploadInput(localPath: string, workspacePath: string): Promise<InputFileRef> {
    return uploadInput(this.api, localPath, workspacePath);
  }

  async getJob(id: string) {
    return (await this.api.request(ApiEndpoint.jobsGet, { id })).job;
  }

  listJobs(request: ListJobsRequest = {}) {
    return this.api.request(ApiEndpoint.jobsList, request);
  }

  async cancelJob(id: string) {
    return (await this.api.request(ApiEndpoint.jobsCancel, { id })).job;
  }

  signalJob(id: string, name: string, payload: unknown = null) {
    return this.api.request(ApiEndpoint.jobsSignal, { id, name, payload: payload as SignalRequest["payload"] });
  }

  signalRun(id: string, name: string, payload: unknown = null) {
    return this.api.request(ApiEndpoint.workflowsSignal, { id, name, payload: payload as SignalRequest["payload"] });
  }

  async retryJob(id: string) {
    return (await this.api.request(ApiEndpoint.jobsRetry, { id })).job;
  }

  async rerunJob(id: string, input?: unknown) {
    return (await this.api.request(ApiEndpoint.jobsRerun, { id, ...(input !== undefined ? { input: input as never } : {}) })).job;
  }

  countJobs(request: CountJobsRequest = {}) {
    return this.api.request(ApiEndpoint.jobsCount, request);
  }

  cleanJobs(request: CleanJobsRequest) {
    return this.api.request(ApiEndpoint.jobsClean, request);
  }

  async waitForJob(id: string, signal?: AbortSignal): Promise<JobRecord> {
    // Listens before the one read: a submitter hears only its own jobs' events, others anyone's.
    const owner = this.api.identity.role === "submitter" ? this.api.identity.user : "*";
    return waitForJobRecord(this.link, this, { id, owner }, (job) => isTerminal(job.state), signal);
  }

  async *events(jobId: string, opts: JobEventsOptions = {}): AsyncGenerator<BoxcarEvent> {
    // Asking for the job checks the caller may see it; its owner is in its events' subjects.
    const job = await this.getJob(jobId);
    yield* opts.chain ? followChain(this.link, this, job, opts) : followJob(this.link, this, job, opts);
  }

  async jobEventsPage(id: string, after: number): Promise<HistoryPage<BoxcarEvent>> {
    return eventsPage(await this.api.request(ApiEndpoint.jobsEvents, { id, after }));
  }

  async runEventsPage(id: string, after: number): Promise<HistoryPage<BoxcarEvent>> {
    return eventsPage(await this.api.request(ApiEndpoint.workflowsEvents, { id, after }));
  }

  async *logs(jobId: string, opts: FollowOptions = {}): AsyncGenerator<LogChunk> {
    const job = await this.getJob(jobId);
    const owner = ownerOf(job);
    const { names } = this.link;
    let final = isTerminal(job.state);
    const read = async (after: number) => logsPage(await this.api.request(ApiEndpoint.jobsLogs, { id: jobId, after }));
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
    return downloadArtifacts(this.api, jobId, job.artifacts, dir);
  }

  applyAgent(definition: unknown) {
    return this.api.request(ApiEndpoint.agentsApply, { definition });
  }

  async getAgent(name: string) {
    return (await this.api.request(ApiEndpoint.agentsGet, { name })).agent;
  }

  async listAgents() {
    return (await this.api.request(ApiEndpoint.agentsList, {})).agents;
  }

  async removeAgent(name: string) {
    await this.api.request(ApiEndpoint.agentsRemove, { name });
  }

  async listWorkers() {
    return (await this.api.request(ApiEndpoint.workersList, {})).workers;
  }

  async openSession(request: OpenSessionRequestInput) {
    // A worker may pull an image to open one.
    return (await this.api.request(ApiEndpoint.sessionsOpen, request, Math.max(this.api.timeoutMs, SESSION_OPEN_WAIT_MS))).session;
  }

  execInSession(request: ExecRequestInput) {
    // As long as the command may run (its timeout, 10 minutes by default), and a margin.
    const runs = (typeof request.timeout === "number" ? request.timeout : parseDurationMs(request.timeout ?? "10m")) ?? 600_000;
    return this.api.request(ApiEndpoint.sessionsExec, request, Math.max(this.api.timeoutMs, runs + SESSION_EXEC_MARGIN_MS));
  }

  /** Starts a command in the session's background: it returns at once (docs/sessions.md#background-processes). */
  async startInSession(request: StartRequestInput) {
    return (await this.api.request(ApiEndpoint.sessionsStart, request)).process;
  }

  inputInSession(id: string, execId: string, data: Uint8Array | string, opts: { close?: boolean } = {}) {
    const body = { id, execId, data: Buffer.from(data).toString("base64"), ...(opts.close ? { close: true } : {}) };
    // The process has 30 s to take it.
    return this.api.request(ApiEndpoint.sessionsInput, body, Math.max(this.api.timeoutMs, SESSION_EXEC_MARGIN_MS));
  }

  async sessionProcesses(id: string) {
    return (await this.api.request(ApiEndpoint.sessionsProcesses, { id })).processes;
  }

  /** Waits up to `timeout` (default 30 s) for a background process to end: its state, and its result once it ended. */
  waitInSession(request: WaitRequestInput) {
    const waits = (typeof request.timeout === "number" ? request.timeout : parseDurationMs(request.timeout ?? "30s")) ?? 30_000;
    return this.api.request(ApiEndpoint.sessionsWait, request, Math.max(this.api.timeoutMs, waits + SESSION_EXEC_MARGIN_MS));
  }

  /** A part of a command's whole output, kept when it wrote past the live window (docs/sessions.md#whole-output). */
  sessionOutput(request: OutputRequestInput) {
    return this.api.request(ApiEndpoint.sessionsOutput, request);
  }

  /** A command's whole kept `stream` from `offset`, part by part. */
  async *keptOutput(id: string, execId: string, stream: "stdout" | "stderr" = "stdout", offset = 0): AsyncGenerator<Uint8Array> {
    for (let at = offset; ; ) {
      const part = await this.sessionOutput({ id, execId, stream, offset: at });
      const data = Buffer.from(part.data, "base64");
      if (data.length > 0) yield data;
      at += data.length;
      if (data.length === 0 || at >= part.size) return;
    }
  }

  async killInSession(id: string, execId: string) {
    return (await this.api.request(ApiEndpoint.sessionsKill, { id, execId })).process;
  }

  async cancelInSession(id: string) {
    return (await this.api.request(ApiEndpoint.sessionsCancel, { id })).session;
  }

  async readSessionFile(id: string, path: string) {
    return Buffer.from((await this.api.request(ApiEndpoint.sessionsFilesRead, { id, path })).data, "base64");
  }

  async readSessionFilePart(request: ReadSessionFileInput) {
    const part = await this.api.request(ApiEndpoint.sessionsFilesRead, { ...request, offset: request.offset ?? 0 });
    return { data: new Uint8Array(Buffer.from(part.data, "base64")), offset: part.offset ?? 0, fileSize: part.fileSize ?? part.size };
  }

  writeSessionFile(
    id: string,
    path: string,
    data: Uint8Array | string,
    opts: { executable?: boolean; offset?: number; size?: number; sha256?: string } = {},
  ) {
    const body = {
      id,
      path,
      data: Buffer.from(data).toString("base64"),
      ...(opts.executable ? { executable: true } : {}),
      ...(opts.offset !== undefined ? { offset: opts.offset } : {}),
      ...(opts.size !== undefined ? { size: opts.size } : {}),
      ...(opts.sha256 !== undefined ? { sha256: opts.sha256 } : {}),
    };
    // A checked write has the session hash the file.
    return this.api.request(ApiEndpoint.sessionsFilesWrite, body, opts.sha256 ? HASHING_WAIT_MS : this.api.timeoutMs);
  }

  statSessionFile(id: string, path: string, opts: { sha256?: boolean } = {}) {
    const sha256 = opts.sha256 === true;
    return this.api.request(ApiEndpoint.sessionsFilesStat, { id, path, sha256 }, sha256 ? HASHING_WAIT_MS : this.api.timeoutMs);
  }

  copyToSession(id: string, localPath: string, path: string, opts: CopyOptions = {}) {
    return copyToSession(this.api, id, localPath, path, opts);
  }

  copyFromSession(id: string, path: string, localPath: string, opts: CopyOptions = {}) {
    return copyFromSession(this.api, id, path, localPath, opts);
  }

  async watchSession(request: WatchRequestInput) {
    // It answers once its folders are watched (up to 30 s for a large workspace).
    return (await this.api.request(ApiEndpoint.sessionsWatch, request, Math.max(this.api.timeoutMs, SESSION_EXEC_MARGIN_MS))).watch;
  }

  connectToSession(id: string, port: number) {
    return connectTunnel(this.api, id, port);
  }

  forwardSessionPort(id: string, port: number, opts?: PortForwardOptions) {
    return forwardPort(() => connectTunnel(this.api, id, port), opts);
  }

  openShell(id: string, opts: ShellOptions) {
    return openShell(this.api, id, opts);
  }

  async unwatchSession(id: string, watchId: string) {
    return (await this.api.request(ApiEndpoint.sessionsUnwatch, { id, watchId })).watch;
  }

  listSessionFiles(request: ListSessionFilesInput) {
    return this.api.request(ApiEndpoint.sessionsFilesList, request);
  }

  async removeSessionFile(id: string, path: string) {
    return (await this.api.request(ApiEndpoint.sessionsFilesRemove, { id, path })).removed;
  }

  async snapshotSession(id: string) {
    // Packing and storing up to a workspace's 1 GiB takes a while.
    return (await this.api.request(ApiEndpoint.sessionsSnapshot, { id }, Math.max(this.api.timeoutMs, SESSION_OPEN_WAIT_MS * 4))).snapshot;
  }

  async listSnapshots() {
    return (await this.api.request(ApiEndpoint.snapshotsList, {})).snapshots;
  }

  async removeSnapshot(id: string) {
    return (await this.api.request(ApiEndpoint.snapshotsRemove, { id })).snapshot;
  }

  async pauseSession(id: string, opts: { timeout?: string | number } = {}) {
    return (await this.api.request(ApiEndpoint.sessionsPause, { id, ...(opts.timeout !== undefined ? { timeout: opts.timeout } : {}) }))
      .session;
  }

  async resumeSession(id: string) {
    return (await this.api.request(ApiEndpoint.sessionsResume, { id })).session;
  }

  async closeSession(id: string) {
    return (await this.api.request(ApiEndpoint.sessionsClose, { id })).session;
  }

  async getSession(id: string) {
    return (await this.api.request(ApiEndpoint.sessionsGet, { id })).session;
  }

  async listSessions(request: ListSessionsRequestInput = {}) {
    return (await this.api.request(ApiEndpoint.sessionsList, request)).sessions;
  }

  async *sessionEvents(id: string, opts: FollowOptions = {}) {
    const read = async (after: number) => eventsPage(await this.api.request(ApiEndpoint.sessionsEvents, { id, after }));
    yield* followPages(this.link.nc, read, await this.followSession(id, opts));
  }

  async *sessionLogs(id: string, opts: FollowOptions = {}) {
    const read = async (after: number) => logsPage(await this.api.request(ApiEndpoint.sessionsLogs, { id, after }));
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
    return (await this.api.request(ApiEndpoint.policyGet, {})).policy;
  }

  setPolicy(policy: SystemPolicyInput) {
    return this.api.request(ApiEndpoint.policySet, { policy });
  }

  async createSchedule(definition: ScheduleDefinitionInput) {
    return (await this.api.request(ApiEndpoint.schedulesCreate, { definition })).schedule;
  }

  async updateSchedule(definition: ScheduleDefinitionInput) {
    return (await this.api.request(ApiEndpoint.schedulesUpdate, { definition })).schedule;
  }

  async getSchedule(name: string, owner?: string) {
    return (await this.api.request(ApiEndpoint.schedulesGet, scheduleRef(name, owner))).schedule;
  }

  async listSchedules() {
    return (await this.api.request(ApiEndpoint.schedulesList, {})).schedules;
  }

  getUsage(day?: string) {
    return this.api.request(ApiEndpoint.usageGet, day === undefined ? {} : { day });
  }

  async pauseSchedule(name: string, owner?: string) {
    return (await this.api.request(ApiEndpoint.schedulesPause, scheduleRef(name, owner))).schedule;
  }

  async resumeSchedule(name: string, owner?: string) {
    return (await this.api.request(ApiEndpoint.schedulesResume, scheduleRef(name, owner))).schedule;
  }

  async deleteSchedule(name: string, owner?: string) {
    return (await this.api.request(ApiEndpoint.schedulesDelete, scheduleRef(name, owner))).schedule;
  }

  waitForChain(jobId: string, signal?: AbortSignal) {
    return waitForChainEnd(this.link, this, jobId, signal);
  }

  startRun(request: StartRunRequest) {
    return this.api.request(ApiEndpoint.workflowsStart, request);
  }

  async getRun(id: string) {
    return (await this.api.request(ApiEndpoint.workflowsGet, { id })).run;
  }

  async listRuns(request: ListRunsRequest = {}) {
    return (await this.listRunsPage(request)).runs;
  }

  async listRunsPage(request: ListRunsRequest = {}) {
    return this.api.request(ApiEndpoint.workflowsList, request);
  }

  async cancelRun(id: string) {
    return (await this.api.request(ApiEndpoint.workflowsCancel, { id })).run;
  }

  async decideStep(id: string, step: string, decision: "approve" | "reject", comment?: string) {
    return (await this.api.request(ApiEndpoint.workflowsApprove, { id, step, decision, ...(comment !== undefined ? { comment } : {}) }))
      .run;
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
