import { getJson, type Topology } from "@boxcar/client";
import { BoxcarError, ErrorCode, JobRecord } from "@boxcar/protocol";
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";

/** A job record with the KV revision it was read at. */
export interface JobHandle {
  record: JobRecord;
  revision: number;
}

export type UpdateResult = { written: true; handle: JobHandle } | { written: false; current: JobHandle | null };

const MAX_TRIES = 5;

export async function readJob(topology: Topology, id: string): Promise<JobHandle | null> {
  const found = await getJson(topology.jobs, id, JobRecord, "job record");
  return found && { record: found.value, revision: found.revision };
}

/**
 * Changes a job record by compare-and-swap, starting from `from`. When the record changed in
 * between, it is read again and `change` decides anew; `change` returns null to leave the record
 * as it is (e.g. someone else owns the job now).
 */
export async function updateJob(
  topology: Topology,
  from: JobHandle,
  change: (current: JobRecord) => JobRecord | null,
): Promise<UpdateResult> {
  let current: JobHandle | null = from;
  for (let tries = 0; tries < MAX_TRIES && current; tries++) {
    const next = change(current.record);
    if (!next) return { written: false, current };
    try {
      const revision = await topology.jobs.update(next.id, JSON.stringify(next), current.revision);
      return { written: true, handle: { record: next, revision } };
    } catch (err) {
      if (!isRevisionConflict(err)) throw err;
    }
    current = await readJob(topology, from.record.id);
  }
  if (!current) return { written: false, current };
  throw new BoxcarError(ErrorCode.conflict, `job ${from.record.id} kept changing under the worker; gave up after ${MAX_TRIES} tries`);
}

function isRevisionConflict(err: unknown): boolean {
  return err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamWrongLastSequence;
}
