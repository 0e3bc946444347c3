import { z } from "zod";
import { type AgentDefinition, PoolName, PROTOCOL_VERSION } from "./agent.js";
import { BoxcarError, ErrorCode } from "./errors.js";
import { isTerminal, type JobRecord, JobState } from "./job.js";
import { type AgentModels, GatewayReach } from "./models.js";
import { modelsOfAgent } from "./prompt-agent.js";
import { RuntimePolicy, resolveRuntime, SandboxBackend } from "./runtime.js";
import { goneAfterMs, WORKER_STATUSES, workerStatus } from "./worker-status.js";

export const WorkerState = z.enum(["running", "draining", "stopped"]);
export type WorkerState = z.infer<typeof WorkerState>;

/** What a worker advertises in the workers bucket, refreshed with every heartbeat. */
export const WorkerInfo = z.looseObject({
  v: z.literal(PROTOCOL_VERSION),
  id: z.string(),
  host: z.string(),
  pid: z.number().int(),
  pools: z.array(PoolName).min(1),
  /** Backends this worker can offer now (a Docker engine answers, an E2B key is set, …). */
  sandboxes: z.array(SandboxBackend),
  /** What its policy allows: with `sandboxes`, enough to tell whether it can run an agent. */
  policy: RuntimePolicy,
  capacity: z.number().int().positive(),
  load: z.number().int().nonnegative(),
  jobs: z.array(z.string()),
  state: WorkerState,
  startedAt: z.iso.datetime(),
  heartbeatAt: z.iso.datetime(),
  /** How often this worker heartbeats: a presence older than a few of these means it is gone. */
  heartbeatMs: z.number().int().positive(),
  /** The work item versions it reads (absent: 1 only, a worker of an earlier release). */
  workItems: z.array(z.number().int().positive()).optional(),
  /** Docker containers standing ready in its warm pool (absent: a worker of an earlier release). */
  warm: z.number().int().nonnegative().optional(),
  /** It takes the jobs submitted to its sessions, from its own consumer (absent: a worker of an earlier release, which does not). */
  sessionJobs: z.boolean().optional(),
  /** What its model gateway offers (absent: a worker of an earlier release, whose keys are not known and not held against it). */
  models: GatewayReach.optional(),
});
export type WorkerInfo = z.infer<typeof WorkerInfo>;

/** A worker's status as its presence says (`worker-status.ts` derives it). */
export const WorkerStatus = z.enum(WORKER_STATUSES);
export type WorkerStatus = z.infer<typeof WorkerStatus>;

/** What became of a job a worker had in hand when it went. */
export const InFlightFate = z.enum([
  /** The record still says it runs on the gone worker: another worker takes it once its lease runs out. */
  "awaiting_redelivery",
  /** Another worker claimed it: a newer attempt runs. */
  "running_elsewhere",
  /** Back in the queue (handed back, or waiting for a retry): a worker will take it. */
  "queued",
  /** It reached a final state, on this worker or another. */
  "finished",
  /** No record of it. */
  "missing",
]);
export type InFlightFate = z.infer<typeof InFlightFate>;

export const InFlightJob = z.strictObject({
  jobId: z.string(),
  fate: InFlightFate,
  state: JobState.optional(),
  attempt: z.number().int().nonnegative().optional(),
  /** The worker the record names now, if any. */
  workerId: z.string().optional(),
  /** One line for people. */
  summary: z.string(),
});
export type InFlightJob = z.infer<typeof InFlightJob>;

/** Accounts for `jobId`, which worker `workerId` had in hand, from the job's record now. */
export function inFlightFate(jobId: string, workerId: string, record: JobRecord | undefined): InFlightJob {
  if (!record) return { jobId, fate: "missing", summary: "no record of this job" };
  const { state, attempt } = record;
  const base = { jobId, state, attempt, ...(record.workerId ? { workerId: record.workerId } : {}) };
  if (isTerminal(state)) {
    const where = record.workerId === undefined ? "" : record.workerId === workerId ? " on this worker" : ` on ${record.workerId}`;
    return { ...base, fate: "finished", summary: `${state}${where} as attempt ${attempt}` };
  }
  if (state === "running" && record.workerId !== workerId) {
    return { ...base, fate: "running_elsewhere", summary: `running on ${record.workerId ?? "another worker"} as attempt ${attempt}` };
  }
  if (state === "running") {
    return { ...base, fate: "awaiting_redelivery", summary: `awaiting redelivery: attempt ${attempt} holds it until its lease runs out` };
  }
  return { ...base, fate: "queued", summary: `queued again after attempt ${attempt}, waiting for a worker` };
}

/** A presence with what a reader derives from it: the shape `boxcar workers --json` prints. */
export const WorkerView = WorkerInfo.extend({
  status: WorkerStatus,
  /** Since its last heartbeat, on the reader's clock. */
  heartbeatAgeMs: z.number(),
  /** Silent longer than this, it is gone (`MISSED_HEARTBEATS` × `heartbeatMs`). */
  goneAfterMs: z.number().int().positive(),
  /** A gone worker's jobs (`jobs` when it last heartbeated) and what became of each. */
  inFlight: z.array(InFlightJob).optional(),
});
export type WorkerView = z.infer<typeof WorkerView>;

const STATUS_ORDER: Record<WorkerStatus, number> = { live: 0, draining: 1, gone: 2, stopped: 3 };

/**
 * Derives each worker's status and, for the gone ones, looks up every job they had in hand
 * (each once, all at the same time, so dozens of workers cost one round of lookups). Sorted
 * live, draining, gone, stopped, then by id.
 */
export async function workerViews(
  workers: readonly WorkerInfo[],
  readJob: (jobId: string) => Promise<JobRecord | undefined>,
  now: number = Date.now(),
): Promise<WorkerView[]> {
  const views = workers.map((info) => ({
    ...info,
    status: workerStatus(info, now),
    heartbeatAgeMs: now - Date.parse(info.heartbeatAt),
    goneAfterMs: goneAfterMs(info),
  }));
  const wanted = new Set(views.filter((v) => v.status === "gone").flatMap((v) => v.jobs));
  const records = new Map(await Promise.all([...wanted].map(async (id) => [id, await readJob(id)] as const)));
  return views
    .map((v) => (v.status === "gone" ? { ...v, inFlight: v.jobs.map((id) => inFlightFate(id, v.id, records.get(id))) } : v))
    .sort((a, b) => STATUS_ORDER[a.status] - STATUS_ORDER[b.status] || a.id.localeCompare(b.id));
}

/**
 * Why `info`'s worker cannot run `agent` (a message that says what to change), or undefined when
 * it can: what it offers (sandboxes, and its model gateway's keys) and its policy decide, as they
 * will when it pulls the job.
 */
export function whyCannotServe(info: WorkerInfo, agent: AgentDefinition): string | undefined {
  try {
    const runtime = resolveRuntime(agent.runtime, agent.trusted, new Set(info.sandboxes), info.policy);
    if (!info.models) return undefined;
    return modelsRefusal(modelsOfAgent(agent), agent.prompt ? undefined : runtime.kind, info.models)?.message;
  } catch (err) {
    return (err as Error).message;
  }
}

/**
 * Why a worker whose gateway offers `gateway` (undefined: it runs none) cannot give an agent its
 * `models` in a `sandbox` of that kind (undefined for a prompt agent, whose calls are the
 * worker's own), or undefined when it can. The worker checks it before a job starts, and the
 * dispatchers check every live worker's presence with it at submit.
 */
export function modelsRefusal(
  models: AgentModels | undefined,
  sandbox: SandboxBackend | undefined,
  gateway: GatewayReach | undefined,
): BoxcarError | undefined {
  if (!models) return undefined;
  const held = gateway?.providers ?? [];
  const missing = models.providers.filter((p) => !held.includes(p));
  if (missing.length > 0) {
    return new BoxcarError(
      ErrorCode.missingSecret,
      `this worker holds no key for ${missing.join(", ")} (models.providers): start it with ${missing.map((p) => `--model-key ${p}=VARIABLE`).join(" ")}`,
    );
  }
  if (sandbox === "e2b" && !gateway?.public) {
    return new BoxcarError(
      ErrorCode.noSandbox,
      "an E2B sandbox reaches the model gateway only at an address E2B's cloud can reach: expose this worker's gateway and give it as --model-gateway-url URL (models.publicUrl) (docs/models.md#e2b-agents)",
    );
  }
  return undefined;
}
