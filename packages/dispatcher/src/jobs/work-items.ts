import { TRACEPARENT } from "@boxcar/common";
import type { Topology, WorkSigner } from "@boxcar/fabric";
import { inputDigest } from "@boxcar/fabric/internal";
import {
  type AgentDefinition,
  BoxcarError,
  ErrorCode,
  type JobRecord,
  ownerOf,
  PROTOCOL_VERSION,
  WORK_ITEM_VERSION,
  type WorkItem,
} from "@boxcar/protocol";
import { headers } from "@nats-io/transport-node";
import type { WorkerDirectory } from "../catalog/worker-directory.js";

/**
 * A job's work item, as the dispatchers publish it for workers: at admission, on a retry of a
 * dead job, when a delayed job's time comes or a concurrency place frees, and in recovery.
 */

/** What publishing a work item needs: the signer, and the workers (which item version they read). */
export interface WorkPublishing {
  /** Signs work items, so workers that check signatures run them; absent: items go unsigned. */
  signer?: WorkSigner | undefined;
  /** The live workers: which work item version they all read. */
  workers: Pick<WorkerDirectory, "allRead">;
  /** Agents' concurrency limits: a job waiting for a place is kept as a marker there. */
  limits: { wait(record: JobRecord, agent: AgentDefinition, msgID: string): Promise<void> };
}

/**
 * Publishes the job's work item, signed when there is a signer, deduplicated by job id (or
 * `msgID`, for a retry); a delayed job's marker instead, while it waits. The input stays in
 * the record (a version 2 item names it by digest) once every live worker reads such items;
 * until then the item carries it.
 */
export async function publishWorkItem(
  topology: Topology,
  record: JobRecord,
  agent: AgentDefinition,
  { signer, workers, limits }: WorkPublishing,
  msgID = record.id,
): Promise<void> {
  const spec = record.spec;
  if (!spec) throw new BoxcarError(ErrorCode.internal, `job ${record.id} has no spec to enqueue`);
  // A delayed job waits as a marker until its time; `LaterConsumer` releases its record (its `runAt`
  // goes) and publishes its item then.
  if (record.runAt !== undefined && Date.parse(record.runAt) > Date.now()) {
    const marker = JSON.stringify({ jobId: record.id, runAt: record.runAt });
    await topology.js.publish(topology.names.subjects.laterWork(record.id), marker, { msgID });
    return;
  }
  // One waiting for a place under its agent's concurrency limit waits as a marker too.
  if (record.concurrency?.waiting) {
    await limits.wait(record, agent, msgID);
    return;
  }
  // The priority is the subject's business and the limits the dispatchers', not the worker's:
  // leaving them out keeps the item runnable by workers of releases before them.
  const { priority: _queuedWith, rateLimit: _limitedBy, concurrency: _placedBy, ...runnable } = agent;
  const input = workers.allRead(WORK_ITEM_VERSION)
    ? { v: WORK_ITEM_VERSION, inputDigest: inputDigest(spec.input) }
    : { v: PROTOCOL_VERSION, input: spec.input };
  const item: WorkItem = {
    ...input,
    jobId: record.id,
    owner: ownerOf(record),
    agent: runnable,
    files: spec.files,
    timeoutMs: spec.timeout ?? agent.runtime.timeout,
  };
  const retry = spec.retry ?? agent.retry;
  if (retry) item.retry = retry;
  if (record.chain) item.chain = record.chain;
  let subject: string;
  if (record.session) {
    // Taken by that worker alone, from the consumer it made for its sessions' jobs.
    item.session = record.session.id;
    subject = topology.names.subjects.sessionWork(record.session.workerId);
  } else {
    await topology.ensurePoolConsumer(record.pool);
    subject = topology.names.subjects.work(record.pool, record.priority);
  }
  await publishWork(topology, subject, JSON.stringify(item), signer, msgID, record.traceparent);
}

/** Publishes a work item on `subject`, signed when there is a signer, with the job's trace context when it has one. */
export async function publishWork(
  topology: Topology,
  subject: string,
  item: string | Uint8Array,
  signer: WorkSigner | undefined,
  msgID: string,
  traceparent?: string,
): Promise<void> {
  const body = typeof item === "string" ? new TextEncoder().encode(item) : item;
  const hdrs = headers();
  if (traceparent) hdrs.set(TRACEPARENT, traceparent);
  signer?.sign(subject, body, hdrs);
  await topology.js.publish(subject, body, { msgID, headers: hdrs });
}
