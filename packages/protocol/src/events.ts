import { z } from "zod";
import { PROTOCOL_VERSION, ResourceLimits } from "./agent.js";
import { ErrorInfo } from "./errors.js";
import { JobState, ResourceUsage, SandboxInfo } from "./job.js";

const base = {
  v: z.literal(PROTOCOL_VERSION),
  at: z.iso.datetime(),
};

export const JobEventType = z.enum([
  "accepted",
  "rejected",
  "queued",
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
]);
export type JobEventType = z.infer<typeof JobEventType>;

/** `<prefix>.evt.job.<jobId>.<type>` */
export const JobEvent = z.looseObject({
  ...base,
  kind: z.literal("job"),
  type: JobEventType,
  jobId: z.string(),
  agent: z.string(),
  state: JobState,
  attempt: z.number().int().nonnegative(),
  workerId: z.string().optional(),
  sandbox: SandboxInfo.optional(),
  message: z.string().optional().describe("progress text, or a summary of the outcome"),
  error: ErrorInfo.optional(),
});
export type JobEvent = z.infer<typeof JobEvent>;

export const SandboxEventType = z.enum(["creating", "ready", "exec_started", "exec_exited", "destroyed", "failed"]);
export type SandboxEventType = z.infer<typeof SandboxEventType>;

/** `<prefix>.evt.sandbox.<jobId>.<type>` */
export const SandboxEvent = z.looseObject({
  ...base,
  kind: z.literal("sandbox"),
  type: SandboxEventType,
  jobId: z.string(),
  attempt: z.number().int().nonnegative(),
  workerId: z.string(),
  backend: z.enum(["host", "docker", "e2b"]),
  sandboxId: z.string(),
  durationMs: z.number().nonnegative().optional().describe("how long this step took"),
  image: z.string().optional().describe("container image or sandbox template"),
  limits: ResourceLimits.optional().describe("the limits the sandbox runs under"),
  network: z.string().optional(),
  exitCode: z.number().int().nullable().optional(),
  signal: z.string().nullable().optional(),
  oomKilled: z.boolean().optional(),
  usage: ResourceUsage.optional(),
  error: ErrorInfo.optional(),
});
export type SandboxEvent = z.infer<typeof SandboxEvent>;

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

export const BoxcarEvent = z.discriminatedUnion("kind", [JobEvent, SandboxEvent, WorkerEvent]);
export type BoxcarEvent = z.infer<typeof BoxcarEvent>;
