import { z } from "zod";
import { PROTOCOL_VERSION, ResourceLimits } from "./agent.js";
import { ErrorInfo } from "./errors.js";
import { JobState, ResourceUsage, SandboxInfo } from "./job.js";
import { ModelCall } from "./models.js";
import { HarnessStep } from "./prompt-agent.js";
import { Usage } from "./usage.js";
import { RunState, StepState } from "./workflow.js";

const base = {
  v: z.literal(PROTOCOL_VERSION),
  at: z.iso.datetime(),
};

export const JobEventType = z.enum([
  "accepted",
  "rejected",
  "queued",
  "released",
  "started",
  "progress",
  "succeeded",
  "failed",
  "timed_out",
  "cancel_requested",
  "cancelled",
  "requeued",
  "retrying",
  "dead",
  "expired",
  "handoff",
  "handoff_refused",
  "usage",
  "signal",
  "model_call",
  "step",
  "tool_call",
  "tool_result",
  "compacted",
  "approval_requested",
]);
export type JobEventType = z.infer<typeof JobEventType>;

/** The user whose job or run an event is about: its subject carries it (absent on older events: `local`). */
const owner = z.string().optional();

/**
 * An event's place among its attempt's events, from 1, as the worker numbers them: the order
 * they happened in, whether they were stored one by one or folded into the attempt's last
 * event. Absent on events a dispatcher publishes.
 */
const seq = z.number().int().positive().optional();

const jobEventFields = {
  ...base,
  kind: z.literal("job"),
  type: JobEventType,
  jobId: z.string(),
  owner,
  agent: z.string(),
  state: JobState,
  attempt: z.number().int().nonnegative(),
  workerId: z.string().optional(),
  sandbox: SandboxInfo.optional(),
  message: z.string().optional().describe("progress text, or a summary of the outcome"),
  error: ErrorInfo.optional(),
  /** On `handoff`: the agent handed to, and the job that continues the chain. */
  to: z.string().optional(),
  next: z.string().optional(),
  /** The workflow run the job belongs to, if any. */
  run: z.string().optional(),
  seq,
  /** On `usage`: what the attempt's calls to its provider used, as its agent reported them or its worker's gateway metered them. */
  usage: Usage.optional(),
  /** On `usage`: who counted it: the worker's model gateway, or the agent's own usage file (its word). */
  usageBy: z.enum(["gateway", "agent"]).optional(),
  /** On `model_call`: one call through the worker's model gateway. */
  call: ModelCall.optional(),
  /** On `step`, `tool_call`, `tool_result` and `compacted`: a prompt agent's loop (docs/harness.md#events). */
  step: HarnessStep.optional(),
};

export const SandboxEventType = z.enum(["creating", "ready", "exec_started", "exec_exited", "destroyed", "failed"]);
export type SandboxEventType = z.infer<typeof SandboxEventType>;

/** `<prefix>.evt.sandbox.<owner>.<jobId>.<type>` */
export const SandboxEvent = z.looseObject({
  ...base,
  kind: z.literal("sandbox"),
  type: SandboxEventType,
  jobId: z.string(),
  owner,
  attempt: z.number().int().nonnegative(),
  workerId: z.string(),
  backend: z.enum(["host", "docker", "e2b"]),
  sandboxId: z.string(),
  durationMs: z.number().nonnegative().optional().describe("how long this step took"),
  image: z.string().optional().describe("container image or sandbox template"),
  limits: ResourceLimits.optional().describe("the limits the sandbox runs under"),
  network: z.string().optional(),
  start: z
    .enum(["warm_hit", "cold"])
    .optional()
    .describe("docker, on ready: a container from the worker's warm pool, or one made for the job"),
  exitCode: z.number().int().nullable().optional(),
  signal: z.string().nullable().optional(),
  oomKilled: z.boolean().optional(),
  usage: ResourceUsage.optional(),
  error: ErrorInfo.optional(),
  seq,
});
export type SandboxEvent = z.infer<typeof SandboxEvent>;

/**
 * `<prefix>.evt.job.<owner>.<jobId>.<type>`. A new job's `accepted` is stored folded into its
 * `queued`. An attempt that ends within a moment (250 ms) stores two events: `started`, and its
 * last (`succeeded`, `failed`, `timed_out`, `cancelled`, `expired`, `retrying`, `dead` or
 * `requeued`) with the events between them in `folded`; a longer one stores each as it happens.
 * {@link unfoldEvents} gives them back one by one.
 */
export const JobEvent = z.looseObject({
  ...jobEventFields,
  folded: z
    .array(z.discriminatedUnion("kind", [z.looseObject(jobEventFields), SandboxEvent]))
    .optional()
    .describe("the events before this one (the attempt's, or `accepted`), oldest first, when they were not stored on their own"),
});
export type JobEvent = z.infer<typeof JobEvent>;

export const WorkerEventType = z.enum(["started", "heartbeat", "draining", "stopped", "work_rejected"]);
export type WorkerEventType = z.infer<typeof WorkerEventType>;

/** `<prefix>.evt.worker.<workerId>.<type>` */
export const WorkerEvent = z.looseObject({
  ...base,
  kind: z.literal("worker"),
  type: WorkerEventType,
  workerId: z.string(),
  load: z.number().int().nonnegative().optional(),
  capacity: z.number().int().positive().optional(),
  error: ErrorInfo.optional(),
});
export type WorkerEvent = z.infer<typeof WorkerEvent>;

export const WorkflowEventType = z.enum([
  "started",
  "step_started",
  "step_finished",
  "step_skipped",
  "handoff",
  "fanned_out",
  "joined",
  "approval_requested",
  "approval_decided",
  "succeeded",
  "failed",
  "cancelled",
]);
export type WorkflowEventType = z.infer<typeof WorkflowEventType>;

/** `<prefix>.evt.workflow.<owner>.<runId>.<type>` */
export const WorkflowEvent = z.looseObject({
  ...base,
  kind: z.literal("workflow"),
  type: WorkflowEventType,
  runId: z.string(),
  owner,
  workflow: z.string(),
  state: RunState,
  step: z.string().optional(),
  /** The fan-out item, for a step that runs one job per item. */
  index: z.number().int().nonnegative().optional(),
  jobId: z.string().optional(),
  /** On `step_finished`: how the step ended. */
  stepState: StepState.optional(),
  /** On `fanned_out`: how many jobs; on `joined`: which steps were joined. */
  count: z.number().int().nonnegative().optional(),
  joined: z.array(z.string()).optional(),
  message: z.string().optional(),
  error: ErrorInfo.optional(),
});
export type WorkflowEvent = z.infer<typeof WorkflowEvent>;

export const SessionEventType = z.enum([
  "opened",
  "exec_started",
  "exec_exited",
  "job_started",
  "job_ended",
  "snapshot",
  "file_changed",
  "paused",
  "resumed",
  "closed",
]);
export type SessionEventType = z.infer<typeof SessionEventType>;

/** `<prefix>.evt.session.<owner>.<sessionId>.<type>` */
export const SessionEvent = z.looseObject({
  ...base,
  kind: z.literal("session"),
  type: SessionEventType,
  sessionId: z.string(),
  owner,
  agent: z.string(),
  workerId: z.string(),
  /** On exec events: the command's id (`<session>.<n>`) and, once it ended, how. */
  execId: z.string().optional(),
  exitCode: z.number().int().nullable().optional(),
  signal: z.string().nullable().optional(),
  durationMs: z.number().nonnegative().optional(),
  /** On job events: the job run in the session (`submit --session`) and, once it ended, its state. */
  jobId: z.string().optional(),
  state: z.string().optional(),
  /** On `closed`: why (`closed`, `idle`, `lifetime`, `pause_timeout`, `worker_stopped`). */
  reason: z.string().optional(),
  /** On `snapshot`: the snapshot taken; on `opened`: the one it started from, if any. */
  snapshot: z.string().optional(),
  /**
   * On `file_changed` (a watch's, `sessions.watch`): the workspace path and how it changed;
   * `overflow`: more changed than a watch reports (its path is the watch's; list the files again).
   */
  path: z.string().optional(),
  change: z.enum(["created", "modified", "removed", "overflow"]).optional(),
  watchId: z.string().optional(),
  error: ErrorInfo.optional(),
});
export type SessionEvent = z.infer<typeof SessionEvent>;

export const BoxcarEvent = z.discriminatedUnion("kind", [JobEvent, SandboxEvent, WorkerEvent, WorkflowEvent, SessionEvent]);
export type BoxcarEvent = z.infer<typeof BoxcarEvent>;
