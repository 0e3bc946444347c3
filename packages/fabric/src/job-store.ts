import { BoxcarError, ErrorCode, JobRecord } from "@boxcar/protocol";
import type { KV } from "@nats-io/kv";
import { getJson } from "./kv-json.js";
import { isRevisionConflict } from "./nats-errors.js";

/** A job record with the KV revision it was read at. */
export interface JobHandle {
  record: JobRecord;
  revision: number;
}

/** What a change did: written (the new record and revision), or left alone (the record as it stands, if any). */
export type JobChange = { written: true; handle: JobHandle } | { written: false; current: JobHandle | null };

/** How many times a change is decided again when the record changed under it. */
const MAX_TRIES = 10;

/**
 * The job records (`<prefix>_jobs`): the one place that writes them. Every change is a
 * compare-and-swap against the revision it was decided on; when another writer (a worker, a
 * dispatcher, a cancel) got there first, the record is read again and the change decided
 * anew, up to 10 times. Errors other than a lost race (NATS out of reach, say) are thrown.
 */
export class JobStore {
  /**
   * `purgeKey` removes every message a key has in the bucket's stream (a JetStream purge
   * filtered on the key's subject), for `remove`.
   */
  constructor(
    private readonly kv: KV,
    private readonly purgeKey: (id: string) => Promise<void>,
  ) {}

  async read(id: string): Promise<JobHandle | null> {
    const found = await getJson(this.kv, id, JobRecord, "job record");
    return found && { record: found.value, revision: found.revision };
  }

  /** Writes a new job's first record; null when a record with its id exists already. */
  async create(record: JobRecord): Promise<JobHandle | null> {
    try {
      return { record, revision: await this.kv.create(record.id, JSON.stringify(record)) };
    } catch (err) {
      if (isRevisionConflict(err)) return null;
      throw err;
    }
  }

  /**
   * Removes a record as it was written (compare-and-swap on its revision): an admission that
   * could not finish takes back its job. True when removed; false when it changed meanwhile.
   */
  async withdraw(handle: JobHandle): Promise<boolean> {
    try {
      await this.kv.delete(handle.record.id, { previousSeq: handle.revision });
      return true;
    } catch (err) {
      if (isRevisionConflict(err)) return false;
      throw err;
    }
  }

  /**
   * Deletes a record for good, as it was read (compare-and-swap on its revision): false when it
   * changed meanwhile. Watchers see the delete; then every revision, the delete marker included,
   * is purged, so nothing of the job stays in the bucket (a marker per deleted job would pile up).
   */
  async remove(handle: JobHandle): Promise<boolean> {
    if (!(await this.withdraw(handle))) return false;
    await this.purgeKey(handle.record.id);
    return true;
  }

  /**
   * Changes a job's record: `decide` gets the record as it stands and returns the next one, or
   * null to leave it as it is. Starts from `from` when the caller has just read it, else reads
   * it. A job that does not exist is left alone.
   */
  async change(from: JobHandle | string, decide: (current: JobRecord) => JobRecord | null): Promise<JobChange> {
    const id = typeof from === "string" ? from : from.record.id;
    let current = typeof from === "string" ? await this.read(id) : from;
    for (let tries = 0; tries < MAX_TRIES && current; tries++) {
      const next = decide(current.record);
      if (!next) return { written: false, current };
      try {
        const revision = await this.kv.update(id, JSON.stringify(next), current.revision);
        return { written: true, handle: { record: next, revision } };
      } catch (err) {
        if (!isRevisionConflict(err)) throw err;
      }
      current = await this.read(id);
    }
    if (!current) return { written: false, current };
    throw new BoxcarError(ErrorCode.conflict, `job ${id} kept changing; gave up after ${MAX_TRIES} tries`);
  }
}
