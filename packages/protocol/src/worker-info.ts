import { z } from "zod";
import { type AgentDefinition, PoolName, PROTOCOL_VERSION } from "./agent.js";
import { RuntimePolicy, resolveRuntime, SandboxBackend } from "./runtime.js";

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
});
export type WorkerInfo = z.infer<typeof WorkerInfo>;

/** A worker whose presence is older than this many of its heartbeats is gone. */
export const MISSED_HEARTBEATS = 3;

/** Whether the worker has heartbeated recently enough to count as alive. */
export function isLive(info: WorkerInfo, now: number = Date.now()): boolean {
  return now - Date.parse(info.heartbeatAt) <= MISSED_HEARTBEATS * info.heartbeatMs;
}

/**
 * Why `info`'s worker cannot run `agent` (a `no_sandbox` message that says what to change), or
 * undefined when it can: what it offers and its policy decide, as they will when it pulls the job.
 */
export function whyCannotServe(info: WorkerInfo, agent: AgentDefinition): string | undefined {
  try {
    resolveRuntime(agent.runtime, agent.trusted, new Set(info.sandboxes), info.policy);
    return undefined;
  } catch (err) {
    return (err as Error).message;
  }
}
