import { z } from "zod";
import { AgentDefinition, AgentName, PoolName } from "./agent.js";
import { ErrorInfo, ErrorIssue } from "./errors.js";
import { BoxcarEvent } from "./events.js";
import { isTerminal, JobRecord, JobSpec, JobState, WorkspacePath } from "./job.js";
import { type ApiEndpoint, TOKEN_PATTERN } from "./names.js";
import { SystemPolicy } from "./policy.js";
import { ListSchedulesReply, ScheduleDefinition, ScheduleRef, ScheduleReply } from "./schedule.js";
import {
  ConnectReply,
  ConnectRequest,
  ExecReply,
  ExecRequest,
  InputReply,
  InputRequest,
  ListSessionFiles,
  ListSessionsReply,
  ListSessionsRequest,
  ListSnapshotsReply,
  OpenSessionRequest,
  OutputReply,
  OutputRequest,
  PauseRequest,
  ProcessesReply,
  ProcessRef,
  ProcessReply,
  ReadSessionFile,
  RemovedSessionFile,
  SessionFileRef,
  SessionFileReply,
  SessionFileStat,
  SessionFilesReply,
  SessionId,
  SessionRef,
  SessionReply,
  ShellReply,
  ShellRequest,
  SnapshotRef,
  SnapshotReply,
  StartRequest,
  StatSessionFile,
  WaitReply,
  WaitRequest,
  WatchRef,
  WatchReply,
  WatchRequest,
  WriteSessionFile,
  WroteSessionFile,
} from "./session.js";
import { durationMs } from "./units.js";
import { UsageReply, UsageRequest } from "./usage.js";
import { WorkerInfo } from "./worker-info.js";
import { RunState, StepName, WorkflowDefinition, WorkflowRun } from "./workflow.js";

/** Every API reply is `{ ok: true, data }` or `{ ok: false, error }`. */
export const ApiReply = z.discriminatedUnion("ok", [
  z.strictObject({ ok: z.literal(true), data: z.unknown() }),
  z.strictObject({ ok: z.literal(false), error: ErrorInfo }),
]);
export type ApiReply = z.infer<typeof ApiReply>;

export const JobRef = z.strictObject({ id: z.string().regex(TOKEN_PATTERN, "a job id is 1-64 letters, digits, '-' or '_'") });

export const SubmitReply = z.strictObject({
  job: JobRecord,
  /** True when an earlier job with the same idempotency key was returned. */
  duplicate: z.boolean(),
});
export type SubmitReply = z.infer<typeof SubmitReply>;

export const ListJobsRequest = z.strictObject({
  state: JobState.optional(),
  agent: AgentName.optional(),
  pool: PoolName.optional(),
  limit: z.number().int().min(1).max(1000).default(50),
  /** Continue after this job id (ids sort by creation time, newest first). */
  after: z.string().optional(),
});
export type ListJobsRequest = z.input<typeof ListJobsRequest>;

export const ListJobsReply = z.strictObject({
  jobs: z.array(JobRecord),
  /** Pass as `after` to get the next page; absent on the last page. */
  next: z.string().optional(),
});
export type ListJobsReply = z.infer<typeof ListJobsReply>;

/** How many of the jobs the caller may see are in each state; `agent`: only that agent's. */
export const CountJobsRequest = z.strictObject({ agent: AgentName.optional() });
export type CountJobsRequest = z.input<typeof CountJobsRequest>;

export const CountJobsReply = z.strictObject({
  /** Every state, 0 where none is in it. */
  counts: z.record(JobState, z.number().int().nonnegative()),
  total: z.number().int().nonnegative(),
});
export type CountJobsReply = z.infer<typeof CountJobsReply>;

/** The reply of every endpoint that answers with one job: get, cancel, retry. */
export const JobReply = z.strictObject({ job: JobRecord });

/** Deletes now the ended jobs that match, as retention would (admins only). */
export const CleanJobsRequest = z.strictObject({
  /** Jobs that ended at least this long ago, in ms or as a duration (`1h`); 0: every ended job. */
  olderThan: durationMs({ min: 0, max: 3_650 * 86_400_000 }),
  state: JobState.refine(isTerminal, "only an ended job can be deleted: give a final state").optional(),
  agent: AgentName.optional(),
});
export type CleanJobsRequest = z.input<typeof CleanJobsRequest>;

/**
 * Why a job that matched a clean was kept, whole: `file_in_use`, a file of its (an input or an
 * artifact) is named by a job not yet ended; `changed`, its record changed while it was being
 * deleted (retried, say); `error`, JetStream refused or did not answer (the message says what),
 * before anything of it was removed. Retention tries each again at its next sweep.
 */
export const KeptReason = z.enum(["file_in_use", "changed", "error"]);
export type KeptReason = z.infer<typeof KeptReason>;

/** One job a clean kept, and why, in words that name what holds it (the object, the job using it). */
export const KeptJob = z.strictObject({ id: z.string(), reason: KeptReason, message: z.string() });
export type KeptJob = z.infer<typeof KeptJob>;

export const CleanJobsReply = z.strictObject({
  /** Jobs deleted by this request: each whole (record, events, output, files), never in part. */
  deleted: z.number().int().nonnegative(),
  /** Jobs that matched but were kept, whole: `keptJobs` says why each. */
  kept: z.number().int().nonnegative(),
  /** Each job kept, with why; sent only when some were (so a client of an earlier release reads a reply that keeps none). */
  keptJobs: z.array(KeptJob).optional(),
  /** More jobs match than one request deletes: ask again. */
  more: z.boolean(),
});
export type CleanJobsReply = z.infer<typeof CleanJobsReply>;

export const AgentRef = z.strictObject({ name: AgentName });
export const ApplyAgentReply = z.strictObject({ agent: AgentDefinition, created: z.boolean() });
export const ListAgentsReply = z.strictObject({ agents: z.array(AgentDefinition) });
export const ListWorkersReply = z.strictObject({ workers: z.array(WorkerInfo) });

export const StartRunRequest = z.strictObject({
  /** The workflow definition, as in a workflow file. */
  workflow: WorkflowDefinition,
  input: z.json().default(null),
  /** A second start with the same key returns the first run. */
  idempotencyKey: z.string().min(1).max(256).optional(),
  labels: z.record(z.string().max(64), z.string().max(256)).default({}),
});
export type StartRunRequest = z.input<typeof StartRunRequest>;

export const RunRef = z.strictObject({ id: z.string().regex(TOKEN_PATTERN, "a run id is 1-64 letters, digits, '-' or '_'") });
/** The most a signal's payload may hold, as JSON. */
export const MAX_SIGNAL_BYTES = 64 * 1024;
/** The most signals a job takes: those kept before it started, then those of each attempt. */
export const MAX_SIGNALS = 1_000;

/** Where in a job's workspace its signals are written (`$BOXCAR_SIGNALS_DIR`). */
export const SIGNALS_DIR = ".boxcar/signals";
/** Where a job's `n`th signal (from 1) is written in its workspace. */
export const signalFile = (n: number, name: string): string => `${SIGNALS_DIR}/${String(n).padStart(4, "0")}-${name}.json`;

/** A signal to a job: a file in its workspace and an event, now or (queued) when it starts (docs/flow-control.md#signals). */
export const SignalRequest = z.strictObject({
  id: z.string().regex(TOKEN_PATTERN, "a job id is 1-64 letters, digits, '-' or '_'"),
  name: z.string().regex(TOKEN_PATTERN, "a signal name is 1-64 letters, digits, '-' or '_'"),
  payload: z
    .json()
    .default(null)
    .refine((p) => Buffer.byteLength(JSON.stringify(p)) <= MAX_SIGNAL_BYTES, "at most 64 KiB of JSON"),
});
export type SignalRequest = z.input<typeof SignalRequest>;
export const SignalReply = z.strictObject({
  job: JobRecord,
  file: z.string().describe("where in the job's workspace the signal was written, or (kept) will be"),
  kept: z.literal(true).optional().describe("the job has not started: the signal is kept, and written before its agent starts"),
});

/** A signal to a run: to each of its jobs running or queued (`id` is the run's). */
export const RunSignalReply = z.strictObject({
  run: WorkflowRun,
  delivered: z
    .array(z.strictObject({ jobId: z.string(), file: z.string(), kept: z.literal(true).optional() }))
    .describe("the jobs it reached (or, `kept`, will when they start), and where"),
  missed: z.array(z.strictObject({ jobId: z.string(), error: ErrorInfo })).describe("running jobs it could not reach, and why"),
});
export type RunSignalReply = z.infer<typeof RunSignalReply>;

/** An approver's decision on a run's approval step (docs/workflows.md#approvals). */
export const ApproveStepRequest = z.strictObject({
  id: RunRef.shape.id,
  step: StepName,
  decision: z.enum(["approve", "reject"]),
  comment: z.string().max(4096).optional(),
});
export type ApproveStepRequest = z.input<typeof ApproveStepRequest>;
export const RunReply = z.strictObject({ run: WorkflowRun });
export const StartRunReply = z.strictObject({ run: WorkflowRun, duplicate: z.boolean() });
export type StartRunReply = z.infer<typeof StartRunReply>;

export const ListRunsRequest = z.strictObject({
  state: RunState.optional(),
  workflow: z.string().optional(),
  /** Only the runs with an approval step that waits for the caller's decision (docs/workflows.md#approvals). */
  awaiting: z.literal(true).optional(),
  limit: z.number().int().min(1).max(1000).default(50),
  /**
   * Pages: `""` for the first page, then the previous reply's `next`, an opaque cursor. Without
   * it the reply is the first `limit` runs and says nothing of more (what clients from before
   * paging, which read replies strictly, expect).
   */
  after: z
    .string()
    .regex(/^$|^\S+ wf-[A-Za-z0-9_-]+$/, 'must be "" or the next of a previous page')
    .optional(),
});
export type ListRunsRequest = z.input<typeof ListRunsRequest>;
export const ListRunsReply = z.strictObject({
  runs: z.array(WorkflowRun),
  /** Only to a request with `after`: pass as `after` to get the next page; absent on the last page. */
  next: z.string().optional(),
});
export type ListRunsReply = z.infer<typeof ListRunsReply>;

/**
 * History is read in pages through the dispatchers, which check the caller may see it: `after`
 * is the stream sequence of the last message already read (0 or absent: from the start).
 */
const After = z.number().int().nonnegative().default(0).describe("the sequence of the last message already read");

export const JobEventsRequest = z.strictObject({ id: JobRef.shape.id, after: After });
export type JobEventsRequest = z.input<typeof JobEventsRequest>;
export const RunEventsRequest = z.strictObject({ id: RunRef.shape.id, after: After });
export type RunEventsRequest = z.input<typeof RunEventsRequest>;

/** One page of history; ask again with `after: last` while `more` is true. */
const Page = {
  /** The sequence of the last message this page covers (returned or skipped); `after` when none. */
  last: z.number().int().nonnegative(),
  /** More messages were stored when this page was read. */
  more: z.boolean(),
};

export const EventsPage = z.strictObject({ events: z.array(BoxcarEvent), ...Page });
export type EventsPage = z.infer<typeof EventsPage>;

export const JobLogsRequest = JobEventsRequest;
/** A session's events or stored output, a page at a time, as a job's. */
export const SessionHistoryRequest = z.strictObject({ id: SessionId, after: After });
export const LogChunkData = z.strictObject({ stream: z.enum(["stdout", "stderr"]), data: z.base64() });
export const LogsPage = z.strictObject({ chunks: z.array(LogChunkData), ...Page });
export type LogsPage = z.infer<typeof LogsPage>;

/** One chunk of an artifact at a time, in order: `after` is the last chunk's sequence. */
export const ArtifactRequest = z.strictObject({ id: JobRef.shape.id, path: z.string().min(1).max(512), after: After });
export type ArtifactRequest = z.input<typeof ArtifactRequest>;
export const ArtifactChunk = z.strictObject({
  data: z.base64(),
  /** The whole artifact's size in bytes and its digest (`SHA-256=<base64url>`), to check the download. */
  size: z.number().int().nonnegative(),
  digest: z.string(),
  ...Page,
});
export type ArtifactChunk = z.infer<typeof ArtifactChunk>;

/**
 * Opens an upload of one input file. The reply names the object the job spec refers to and the
 * subject the chunks go to, in order, each a request with the raw bytes as its body; the last
 * carries the `Boxcar-Upload-End` header with the file's size in bytes.
 */
export const UploadRequest = z.strictObject({ path: WorkspacePath });
export const UploadReply = z.strictObject({ object: z.string(), subject: z.string() });
export type UploadReply = z.infer<typeof UploadReply>;
export const UPLOAD_END_HEADER = "Boxcar-Upload-End";
/** The reply to an upload's last chunk: what was stored. */
export const UploadDone = z.strictObject({ object: z.string(), size: z.number().int().nonnegative(), digest: z.string() });

export const PolicyReply = z.strictObject({ policy: SystemPolicy });
export const SetPolicyReply = z.strictObject({
  policy: SystemPolicy,
  /** Applied agents the new policy refuses: they stay, but jobs cannot be submitted to them. */
  refusedAgents: z.array(z.strictObject({ name: z.string(), issues: z.array(ErrorIssue) })),
});
export type SetPolicyReply = z.infer<typeof SetPolicyReply>;

const NoFields = z.strictObject({});
const AgentReply = z.strictObject({ agent: AgentDefinition });

/**
 * The API's contract: each endpoint's request body and the `data` of its reply when `ok`
 * (docs/nats-api.md). Published as JSON Schemas (`schemas/api/<endpoint>.schema.json`, its
 * `$defs.request` and `$defs.reply`), named in each endpoint's `$SRV.INFO` metadata, and checked
 * against what a real system answers (`test/wire-schemas.test.ts`).
 */
/** `jobs.rerun`: a new job with an ended job's spec, and `input` in place of its input when given. */
export const RerunRequest = z.strictObject({
  id: z.string().min(1),
  input: z.json().optional().describe("the new job's input; absent: the old job's"),
});
export type RerunRequest = z.input<typeof RerunRequest>;

export const API_CONTRACT = {
  "jobs.submit": { request: JobSpec, reply: SubmitReply },
  "jobs.get": { request: JobRef, reply: JobReply },
  "jobs.list": { request: ListJobsRequest, reply: ListJobsReply },
  "jobs.count": { request: CountJobsRequest, reply: CountJobsReply },
  "jobs.cancel": { request: JobRef, reply: JobReply },
  "jobs.retry": { request: JobRef, reply: JobReply },
  "jobs.rerun": { request: RerunRequest, reply: JobReply },
  "jobs.clean": { request: CleanJobsRequest, reply: CleanJobsReply },
  "jobs.events": { request: JobEventsRequest, reply: EventsPage },
  "jobs.logs": { request: JobLogsRequest, reply: LogsPage },
  "jobs.artifact": { request: ArtifactRequest, reply: ArtifactChunk },
  "agents.apply": { request: z.strictObject({ definition: AgentDefinition }), reply: ApplyAgentReply },
  "agents.get": { request: AgentRef, reply: AgentReply },
  "agents.list": { request: NoFields, reply: ListAgentsReply },
  "agents.remove": { request: AgentRef, reply: AgentReply },
  "workers.list": { request: NoFields, reply: ListWorkersReply },
  "workflows.start": { request: StartRunRequest, reply: StartRunReply },
  "workflows.get": { request: RunRef, reply: RunReply },
  "workflows.list": { request: ListRunsRequest, reply: ListRunsReply },
  "workflows.cancel": { request: RunRef, reply: RunReply },
  "workflows.events": { request: RunEventsRequest, reply: EventsPage },
  "inputs.upload": { request: UploadRequest, reply: UploadReply },
  "policy.get": { request: NoFields, reply: PolicyReply },
  "policy.set": { request: z.strictObject({ policy: SystemPolicy }), reply: SetPolicyReply },
  "sessions.open": { request: OpenSessionRequest, reply: SessionReply },
  "sessions.exec": { request: ExecRequest, reply: ExecReply },
  "sessions.close": { request: SessionRef, reply: SessionReply },
  "sessions.get": { request: SessionRef, reply: SessionReply },
  "sessions.list": { request: ListSessionsRequest, reply: ListSessionsReply },
  "sessions.events": { request: SessionHistoryRequest, reply: EventsPage },
  "sessions.logs": { request: SessionHistoryRequest, reply: LogsPage },
  "sessions.cancel": { request: SessionRef, reply: SessionReply },
  "sessions.start": { request: StartRequest, reply: ProcessReply },
  "sessions.processes": { request: SessionRef, reply: ProcessesReply },
  "sessions.wait": { request: WaitRequest, reply: WaitReply },
  "sessions.kill": { request: ProcessRef, reply: ProcessReply },
  "sessions.input": { request: InputRequest, reply: InputReply },
  "sessions.output": { request: OutputRequest, reply: OutputReply },
  "sessions.files.read": { request: ReadSessionFile, reply: SessionFileReply },
  "sessions.files.write": { request: WriteSessionFile, reply: WroteSessionFile },
  "sessions.files.list": { request: ListSessionFiles, reply: SessionFilesReply },
  "sessions.files.remove": { request: SessionFileRef, reply: RemovedSessionFile },
  "sessions.files.stat": { request: StatSessionFile, reply: SessionFileStat },
  "sessions.watch": { request: WatchRequest, reply: WatchReply },
  "sessions.unwatch": { request: WatchRef, reply: WatchReply },
  "sessions.connect": { request: ConnectRequest, reply: ConnectReply },
  "sessions.shell": { request: ShellRequest, reply: ShellReply },
  "sessions.pause": { request: PauseRequest, reply: SessionReply },
  "sessions.resume": { request: SessionRef, reply: SessionReply },
  "sessions.snapshot": { request: SessionRef, reply: SnapshotReply },
  "snapshots.list": { request: NoFields, reply: ListSnapshotsReply },
  "snapshots.remove": { request: SnapshotRef, reply: SnapshotReply },
  "schedules.create": { request: z.strictObject({ definition: ScheduleDefinition }), reply: ScheduleReply },
  "schedules.update": { request: z.strictObject({ definition: ScheduleDefinition }), reply: ScheduleReply },
  "schedules.get": { request: ScheduleRef, reply: ScheduleReply },
  "schedules.list": { request: NoFields, reply: ListSchedulesReply },
  "schedules.pause": { request: ScheduleRef, reply: ScheduleReply },
  "schedules.resume": { request: ScheduleRef, reply: ScheduleReply },
  "schedules.delete": { request: ScheduleRef, reply: ScheduleReply },
  "usage.get": { request: UsageRequest, reply: UsageReply },
  "workflows.approve": { request: ApproveStepRequest, reply: RunReply },
  "jobs.signal": { request: SignalRequest, reply: SignalReply },
  "workflows.signal": { request: SignalRequest, reply: RunSignalReply },
} as const satisfies Record<ApiEndpoint, { request: z.ZodType; reply: z.ZodType }>;

/** The `data` of an endpoint's reply, as `API_CONTRACT` says. */
export type ApiReplyData<E extends ApiEndpoint> = z.output<(typeof API_CONTRACT)[E]["reply"]>;

/** Where an endpoint's JSON Schema is published, under `schemas/`. */
export const apiSchemaFile = (endpoint: ApiEndpoint): string => `api/${endpoint}.schema.json`;

const metadata = new Map<ApiEndpoint, Record<string, string>>();

/**
 * What `$SRV.INFO` says of an endpoint besides its subject: its request's JSON Schema, and where
 * the whole contract (request and reply) is published. The reply's schema is not inlined: with
 * the job records and runs in it, every endpoint's would make one INFO reply about 160 KB.
 */
export function apiEndpointMetadata(endpoint: ApiEndpoint): Record<string, string> {
  let found = metadata.get(endpoint);
  if (!found) {
    const request = z.toJSONSchema(API_CONTRACT[endpoint].request, { io: "input", unrepresentable: "any" });
    found = { "boxcar.request.schema": JSON.stringify(request), "boxcar.schema": `schemas/${apiSchemaFile(endpoint)}` };
    metadata.set(endpoint, found);
  }
  return found;
}
