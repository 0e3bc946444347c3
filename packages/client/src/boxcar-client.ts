/**
 * What a client of Boxcar offers (`BoxcarClient`): submitting and watching jobs, workflow runs,
 * agents and workers, sessions and their files, the policy, schedules and usage; and the
 * options and values its methods take and give. `createClient` (client.ts) makes one.
 */

import type { Duplex } from "node:stream";
import type {
  AgentDefinition,
  BoxcarEvent,
  CleanJobsReply,
  CleanJobsRequest,
  CountJobsReply,
  CountJobsRequest,
  ExecReply,
  ExecRequestInput,
  Identity,
  InputFileRef,
  JobRecord,
  JobSpecInput,
  ListJobsRequest,
  ListRunsReply,
  ListRunsRequest,
  ListSessionFilesInput,
  ListSessionsRequestInput,
  LogStream,
  OpenSessionRequestInput,
  OutputReply,
  OutputRequestInput,
  ProcessInfo,
  ReadSessionFileInput,
  RunSignalReply,
  ScheduleDefinitionInput,
  ScheduleRecord,
  SessionFileStat,
  SessionRecord,
  SetPolicyReply,
  SnapshotInfo,
  StartRequestInput,
  StartRunRequest,
  SystemPolicy,
  SystemPolicyInput,
  UsageReply,
  WaitReply,
  WaitRequestInput,
  WatchInfo,
  WatchRequestInput,
  WorkerInfo,
  WorkflowRun,
} from "@boxcar/protocol";
import type { FollowOptions } from "./follow.js";
import type { PortForward, PortForwardOptions } from "./session-ports.js";
import type { SessionShell, ShellOptions } from "./session-shell.js";
import type { CopiedFile, CopyOptions } from "./session-transfers.js";

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

/** Submits and watches jobs, manages agents, reads results and artifacts. */
export interface BoxcarClient {
  submit(spec: JobSpecInput, opts?: SubmitOptions): Promise<{ job: JobRecord; duplicate: boolean }>;
  /** Puts a local file in the Object Store and returns the reference a job spec carries. */
  uploadInput(localPath: string, workspacePath: string): Promise<InputFileRef>;
  getJob(id: string): Promise<JobRecord>;
  listJobs(request?: ListJobsRequest): Promise<{ jobs: JobRecord[]; next?: string }>;
  cancelJob(id: string): Promise<JobRecord>;
  /** Runs a dead job again, with a fresh budget of attempts. */
  /** Runs an ended job again (dead, failed, timed out or cancelled), its history kept. */
  retryJob(id: string): Promise<JobRecord>;
  /** A new job with an ended job's spec, and `input` in place of its input when given; it names the old one (`rerunOf`). */
  rerunJob(id: string, input?: unknown): Promise<JobRecord>;
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
  /**
   * Starts a command in the session's background; it returns at once, and runs beside its
   * commands and jobs. `openStdin`: its stdin stays open for `inputInSession`.
   */
  startInSession(request: StartRequestInput): Promise<ProcessInfo>;
  /** Writes `data` to the stdin of a background process started with `openStdin`; `close`: its stdin is closed after. */
  inputInSession(
    id: string,
    execId: string,
    data: Uint8Array | string,
    opts?: { close?: boolean },
  ): Promise<{ process: ProcessInfo; written: number }>;
  /** The session's background processes, running and (the last 32) ended. */
  sessionProcesses(id: string): Promise<ProcessInfo[]>;
  /** Waits up to `timeout` for a background process to end: its state, and its result (as an exec's) once it ended. */
  waitInSession(request: WaitRequestInput): Promise<WaitReply>;
  /** A part of a command's whole output (kept when it wrote past the 4 MiB live window): `data` (base64) from `offset`, and the stream's kept `size`. */
  sessionOutput(request: OutputRequestInput): Promise<OutputReply>;
  /** A command's whole kept `stream` from `offset`, part by part. */
  keptOutput(id: string, execId: string, stream?: "stdout" | "stderr", offset?: number): AsyncGenerator<Uint8Array>;
  /** Kills a background process (its whole process group). */
  killInSession(id: string, execId: string): Promise<ProcessInfo>;
  /** A file of the session's workspace (at most 512 KiB; larger: `readSessionFilePart`, or `copyFromSession`). */
  readSessionFile(id: string, path: string): Promise<Uint8Array>;
  /** A part of a file of the session's workspace (`length`, at most 512 KiB, from `offset`), and the whole file's size. */
  readSessionFilePart(request: ReadSessionFileInput): Promise<{ data: Uint8Array; offset: number; fileSize: number }>;
  /**
   * Writes a file in the session's workspace (at most 512 KiB), making its folders; it replaces
   * what was there (`executable`: mode 0755). Or a part of a larger one: `offset` (0 starts it,
   * more adds to it) and the whole file's `size`; `sha256`, with its last part, has the session
   * check the file once written.
   */
  writeSessionFile(
    id: string,
    path: string,
    data: Uint8Array | string,
    opts?: { executable?: boolean; offset?: number; size?: number; sha256?: string },
  ): Promise<{ path: string; size: number; fileSize?: number; sha256?: string }>;
  /** What a path of the session's workspace is: a file (its size; with `sha256`, its SHA-256 too) or a folder. */
  statSessionFile(id: string, path: string, opts?: { sha256?: boolean }): Promise<SessionFileStat>;
  /**
   * Copies a local file or folder into the session, in parts, each file checked by its SHA-256
   * there; a copy interrupted goes on from what the session holds (docs/sessions.md#big-files).
   * A folder's files go under `path`; a file into a folder there goes in by its name.
   */
  copyToSession(id: string, localPath: string, path: string, opts?: CopyOptions): Promise<CopiedFile[]>;
  /** Copies a file or folder of the session here, in parts, each checked by its SHA-256; an interrupted copy goes on from its `.boxcar-part` file. */
  copyFromSession(id: string, path: string, localPath: string, opts?: CopyOptions): Promise<CopiedFile[]>;
  /** Watches a path of the session's workspace (default: all of it): each change is a `file_changed` event of the session's. */
  watchSession(request: WatchRequestInput): Promise<WatchInfo>;
  /** Stops a watch. */
  unwatchSession(id: string, watchId: string): Promise<WatchInfo>;
  /**
   * One TCP connection to `port` on the session's own loopback, through its worker
   * (docs/sessions.md#ports), as a stream: what is written to it reaches the port, what the port
   * sends is read from it. Rejects `unavailable` when nothing listens there; the session's owner
   * (or an admin) only.
   */
  connectToSession(id: string, port: number): Promise<Duplex>;
  /**
   * Listens on a local port (default: a free one on 127.0.0.1) and relays each connection it takes
   * to `port` in the session, each through its own tunnel, until closed.
   */
  forwardSessionPort(id: string, port: number, opts?: PortForwardOptions): Promise<PortForward>;
  /**
   * Starts a shell (or `argv`) on a terminal of `cols` by `rows` in the session
   * (docs/sessions.md#shell), a process of its background, and gives its terminal's bytes as a
   * stream, with `resize` and how it `exited`. The session's owner (or an admin) only; Docker and
   * host sessions.
   */
  openShell(id: string, opts: ShellOptions): Promise<SessionShell>;
  /** The regular files of the session's workspace, or of one folder of it. */
  listSessionFiles(request: ListSessionFilesInput): Promise<{ files: Array<{ path: string; size: number }>; truncated: boolean }>;
  /** Removes a file or folder of the session's workspace; false when there was none. */
  removeSessionFile(id: string, path: string): Promise<boolean>;
  /** Stores the session's workspace (folders and regular files) as a snapshot, which `openSession({ from })` starts a session with. */
  snapshotSession(id: string): Promise<SnapshotInfo>;
  /** Your snapshots (a viewer or an admin: everyone's), newest first. */
  listSnapshots(): Promise<SnapshotInfo[]>;
  removeSnapshot(id: string): Promise<SnapshotInfo>;
  /**
   * Pauses the session (docs/sessions.md#pause): every process of it held where it is, its
   * memory kept, until `resumeSession`, its close, or `timeout` (default 1h, at most 24h; then it
   * closes). Docker sessions only; its owner (or an admin).
   */
  pauseSession(id: string, opts?: { timeout?: string | number }): Promise<SessionRecord>;
  /** Lets a paused session's processes go on from where they were. */
  resumeSession(id: string): Promise<SessionRecord>;
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
