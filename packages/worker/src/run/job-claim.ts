import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { inputDigest, listJson, publishEvent } from "@boxcar/fabric/internal";
import {
  BoxcarError,
  ErrorCode,
  type ErrorInfo,
  isTerminal,
  type JobEventType,
  type JobRecord,
  type ResolvedRuntime,
  toErrorInfo,
  WorkerInfo,
  type WorkItem,
} from "@boxcar/protocol";
import {
  checkAgentPolicy,
  isLive,
  jobEvent,
  modelsOfAgent,
  modelsRefusal,
  resolveRuntime,
  whyCannotServe,
} from "@boxcar/protocol/internal";
import type { ModelGateway } from "../gateway/gateway.js";
import type { SandboxBackend, SandboxProvider } from "../sandbox/sandbox.js";
import type { ResolvedWorkerOptions } from "../worker-options.js";
import { collectSecrets } from "../workspace/agent-contract.js";

/** A lost outcome event is published again only this soon after the job ended (the events stream's duplicate window is 2 min). */
const REPUBLISH_WITHIN_MS = 90_000;

/**
 * What the claim decided before touching the record: the sandbox and the agent's secrets, or why
 * the job cannot run, and whether another worker may (what this one offers does not fit the
 * agent: its sandboxes, or its model gateway's keys), so that it is handed back for one that does.
 */
export type Preflight =
  | { ok: true; runtime: ResolvedRuntime; secrets: Map<string, string> }
  | { ok: false; error: ErrorInfo; otherMayRun: boolean };

/** What a claim's checks use of the worker. */
export interface ClaimWorker {
  options: Pick<ResolvedWorkerOptions, "workerId" | "agentPolicy" | "policy" | "secretsEnv">;
  /** Backends whose provider is available now. */
  capabilities(): ReadonlySet<SandboxBackend>;
  providers: ReadonlyMap<SandboxBackend, SandboxProvider>;
  gateway: Pick<ModelGateway, "reach"> | undefined;
}

/** What can fail before anything starts: the worker's policy refuses the agent, no sandbox fits, its gateway lacks a provider's key, or a secret is missing. */
export function preflightCheck(item: WorkItem, worker: ClaimWorker): Preflight {
  try {
    checkAgentPolicy(item.agent, worker.options.agentPolicy, "this worker's policy");
    const runtime = resolveRuntime(item.agent.runtime, item.agent.trusted, worker.capabilities(), worker.options.policy);
    const unreachable = modelsRefusal(modelsOfAgent(item.agent), item.agent.prompt ? undefined : runtime.kind, worker.gateway?.reach());
    if (unreachable) return { ok: false, error: toErrorInfo(unreachable), otherMayRun: true };
    return { ok: true, runtime, secrets: collectSecrets(item.agent, worker.options.secretsEnv) };
  } catch (err) {
    const error = toErrorInfo(err);
    return { ok: false, error, otherMayRun: error.code === ErrorCode.noSandbox };
  }
}

/**
 * A version 2 work item leaves the input in the job record: it is taken from there only if it
 * is the input the dispatcher signed for (by digest), whoever else may write records. Returns
 * the item with its input, or why the job cannot run when it is not.
 */
export function takeInput(item: WorkItem, record: JobRecord): { item: WorkItem } | { error: ErrorInfo } {
  if (item.v === 1) return { item };
  const input = record.spec?.input;
  if (record.spec && inputDigest(input) === item.inputDigest) return { item: { ...item, input } };
  return {
    error: toErrorInfo(
      new BoxcarError(ErrorCode.invalid, "the job record's input is not the one its signed work item names (by digest); it was not run"),
    ),
  };
}

/**
 * Another live worker of the pool that can run this agent, if any. A presence list that cannot
 * be read (a cluster electing leaders, say) throws, and the item is handed back: reading it as
 * "no such worker" would fail a job another worker could run.
 */
export async function capableWorker(
  topology: Topology,
  workerId: string,
  pool: string,
  agent: WorkItem["agent"],
): Promise<string | undefined> {
  const workers = await listJson(topology.workers, WorkerInfo, "worker");
  return workers.find(
    (w) => w.id !== workerId && w.state === "running" && w.pools.includes(pool) && isLive(w) && whyCannotServe(w, agent) === undefined,
  )?.id;
}

/**
 * A new attempt of a job whose worker crashed or froze: the sandboxes of its earlier attempts
 * that this worker's backends can reach are removed before this one starts, so the agent does
 * not run twice at once (the reaper finds those on other engines once their worker is gone).
 * Returns how many were removed.
 */
export async function removeEarlierAttempts(worker: ClaimWorker, jobId: string, attempt: number, log: Logger): Promise<number> {
  let all = 0;
  for (const provider of worker.providers.values()) {
    if (!provider.removeEarlierAttempts || !worker.capabilities().has(provider.kind)) continue;
    const removed = await provider.removeEarlierAttempts(jobId, attempt).catch((err: unknown) => {
      log.warn({ err, backend: provider.kind }, "could not look for sandboxes of earlier attempts");
      return 0;
    });
    if (removed > 0) log.warn({ backend: provider.kind, removed }, "removed sandboxes of earlier attempts that were still there");
    all += removed;
  }
  return all;
}

/**
 * A job whose work item comes back after it ended: its worker may have died between writing
 * the outcome and publishing its event. The event is published again; the events stream drops
 * it if it was stored (same message id), so only within its duplicate window.
 */
export async function republishOutcome(topology: Topology, record: JobRecord, log: Logger): Promise<void> {
  if (!isTerminal(record.state) || record.attempt === 0 || !record.finishedAt) return;
  if (Date.now() - Date.parse(record.finishedAt) > REPUBLISH_WITHIN_MS) return;
  // A final state is also the type of the event that announces it, dated when the job ended
  // (a reader that orders events by `at` sees the end where it happened, not when it was noticed).
  const event = jobEvent(record, record.state as JobEventType, {
    at: record.finishedAt,
    ...(record.workerId ? { workerId: record.workerId } : {}),
    ...(record.sandbox ? { sandbox: record.sandbox } : {}),
    ...(record.error ? { message: record.error.message } : {}),
  });
  await publishEvent(topology, event).catch((err: unknown) => log.warn({ err }, "could not publish the outcome event again"));
}
