import { setTimeout as sleep } from "node:timers/promises";
import type { Topology } from "@boxcar/fabric";
import { getJson, isNoResponders, nowIso } from "@boxcar/fabric/internal";
import {
  BoxcarError,
  type CountJobsReply,
  CountJobsRequest,
  ErrorCode,
  type Identity,
  JobRecord,
  ownerOf,
  parseWith,
  signalFile,
} from "@boxcar/protocol";
import { JobTransitions, mayAccess } from "@boxcar/protocol/internal";
import type { JobIndex } from "./job-index.js";

/** The caller of what a dispatcher does on its own account: it sees every job. */
const DISPATCHER: Identity = { role: "dispatcher", user: "dispatcher" };

/** The most bytes of records one `jobs.list` reply carries, under NATS's 1 MiB message limit. */
export const LIST_REPLY_BUDGET = 768 * 1024;

/** How many of the jobs `caller` may see are in each state, from the job index. */
export async function countJobs(
  jobs: { index: JobIndex; caughtUp: Promise<void> },
  raw: unknown,
  caller: Identity,
): Promise<CountJobsReply> {
  const req = parseWith(CountJobsRequest, raw, "count request");
  await caughtUp(jobs);
  const counts = jobs.index.counts((owner) => mayAccess(caller, owner), req.agent);
  return { counts, total: Object.values(counts).reduce((a, b) => a + b, 0) };
}

/** Right after a dispatcher starts, its index is still being filled from the bucket: wait a moment for it. */
export async function caughtUp(jobs: { caughtUp: Promise<void> }): Promise<void> {
  const waited = new AbortController();
  await Promise.race([jobs.caughtUp, sleep(CATCH_UP_WAIT_MS, undefined, { signal: waited.signal }).catch(() => {})]);
  waited.abort();
}

/** How long a list waits for a dispatcher that has just started to finish reading the job records. */
const CATCH_UP_WAIT_MS = 5_000;

/**
 * Cancels a job. A job not yet started is marked cancelled and never starts; a running one is
 * flagged and its worker told over `<prefix>.ctl.cancel.<id>`. Cancelling a cancelled job is a
 * no-op; cancelling a finished one is a conflict. A job `caller` may not see is not found; the
 * dispatcher's own cancels (of a workflow run's jobs) are made as itself.
 */
export async function cancelJob(topology: Topology, id: string, caller: Identity = DISPATCHER): Promise<JobRecord> {
  // A job's owner never changes: checked once, on the record the change starts from.
  const found = await topology.jobStore.read(id);
  if (!found || !mayAccess(caller, ownerOf(found.record))) throw new BoxcarError(ErrorCode.notFound, `no job ${id}`);
  const change = await topology.jobStore.change(found, (job) => JobTransitions.cancel(job, nowIso()));
  if (!change.written) {
    if (!change.current) throw new BoxcarError(ErrorCode.notFound, `no job ${id}`);
    return change.current.record; // cancelled already, or asked to be
  }
  const next = change.handle.record;
  if (next.state === "running") topology.nc.publish(topology.names.subjects.cancel(id));
  else await removeWaitingMarker(topology, next);
  return next;
}

/**
 * Removes the marker a job that ended while it waited left in the work stream, if it is still
 * there: a delayed job's (rather than wait for its time) or one waiting for a concurrency place
 * (rather than count as work until a place frees).
 */
export async function removeWaitingMarker(topology: Topology, job: JobRecord): Promise<void> {
  const { jsm, names } = topology;
  const subject =
    job.runAt !== undefined
      ? names.subjects.laterWork(job.id)
      : job.concurrency?.waiting
        ? names.subjects.heldWork(job.concurrency.place, job.id)
        : undefined;
  if (subject === undefined) return;
  const marker = await jsm.streams.getMessage(names.streams.work, { last_by_subj: subject }).catch(() => null);
  if (marker) await jsm.streams.deleteMessage(names.streams.work, marker.seq, false).catch(() => {});
}

/** How long a signal waits for the worker running its job to write it. */
const SIGNAL_WAIT_MS = 5_000;

/**
 * Sends a signal to a running job (docs/flow-control.md#signals): the worker running it writes
 * it to the agent's signals folder and publishes a `signal` event, and says where. A job not
 * running, or whose agent is not (starting, ending), is a `conflict`; one `caller` may not see
 * is not found.
 */
export async function signalJob(
  topology: Topology,
  request: { id: string; name: string; payload: unknown },
  caller: Identity,
): Promise<{ job: JobRecord; file: string; kept?: true }> {
  const found = await topology.jobStore.read(request.id);
  if (!found || !mayAccess(caller, ownerOf(found.record))) throw new BoxcarError(ErrorCode.notFound, `no job ${request.id}`);
  let job = found.record;
  if (job.state === "queued") {
    // Kept in its record, or (it started meanwhile) sent to its worker as it runs now.
    const signal = { name: request.name, payload: (request.payload ?? null) as Kept["payload"], at: nowIso() };
    const kept = await topology.jobStore.change(found, (current) => JobTransitions.keepSignal(current, signal));
    if (kept.written)
      return { job: kept.handle.record, file: signalFile(kept.handle.record.signals?.length ?? 1, request.name), kept: true };
    if (!kept.current) throw new BoxcarError(ErrorCode.notFound, `no job ${request.id}`);
    job = kept.current.record;
  }
  const notRunning = (why: string) => new BoxcarError(ErrorCode.conflict, `job ${job.id} cannot take a signal: ${why}`);
  if (job.state !== "running") throw notRunning(`it is ${job.state}`);
  let reply: { file?: unknown; error?: unknown };
  try {
    const body = JSON.stringify({ name: request.name, payload: request.payload });
    reply = (await topology.nc.request(topology.names.subjects.signal(job.id), body, { timeout: SIGNAL_WAIT_MS })).json();
  } catch (err) {
    if (isNoResponders(err)) throw notRunning("no worker runs it now (it is being handed over, or its worker is gone)");
    throw new BoxcarError(ErrorCode.unavailable, `the worker running job ${job.id} did not answer the signal in time`, { cause: err });
  }
  if (typeof reply.file !== "string") throw notRunning(typeof reply.error === "string" ? reply.error : "its worker refused it");
  return { job, file: reply.file };
}

type Kept = NonNullable<JobRecord["signals"]>[number];

/** The job's record; one that `caller` may not see is not found, as one that does not exist. */
export async function getRecord(topology: Topology, id: string, caller: Identity): Promise<JobRecord> {
  const found = await getJson(topology.jobs, id, JobRecord, "job record");
  if (!found || !mayAccess(caller, ownerOf(found.value))) throw new BoxcarError(ErrorCode.notFound, `no job ${id}`);
  return found.value;
}
