import { BoxcarError, ErrorCode, type JobEvent, JobRecord } from "@boxcar/protocol";
import type { JobStep } from "@boxcar/protocol/internal";
import type { KV } from "@nats-io/kv";
import { getJson } from "./kv-json.js";
import { isRevisionConflict, isStorageFull } from "./nats-errors.js";

/** A job record with the KV revision it was read at. */
export interface JobHandle {
  record: JobRecord;
  revision: number;
}

/** What a change did: written (the new record and revision), or left alone (the record as it stands, if any). */
export type JobChange = { written: true; handle: JobHandle } | { written: false; current: JobHandle | null };

/** Publishes a job event and resolves once it is stored. */
export type Announce = (event: JobEvent) => Promise<void>;

/**
 * A record written whose event was not stored: `handle` is the record as written, `cause` why
 * the event was not. Its message is the cause's, and `isStorageFull` and the like see the cause.
 */
export class EventNotStored extends Error {
  constructor(
    readonly handle: JobHandle,
    cause: unknown,
  ) {
    super(cause instanceof Error ? cause.message : String(cause), { cause });
    this.name = "EventNotStored";
  }
}

/** How many times a change is decided again when the record changed under it. */
const MAX_TRIES = 10;

/** What the store does to a key in the bucket's stream, beyond what KV does. */
export interface JobKeys {
  /**
   * Removes one revision of a record from the bucket's stream by its sequence (which writes
   * nothing). Resolves with whether it was there (false: gone, or replaced by a later one).
   */
  removeRevision(id: string, revision: number): Promise<boolean>;
  /**
   * Writes a delete marker for a key that has no message left (the write expects none), so that
   * watchers forget the job; refused when a record of that id was written since.
   */
  markDeleted(id: string): Promise<void>;
}

/**
 * How long a delete marker the store has no room for is tried again, in the background, and the
 * pauses between tries (doubling).
 */
const MARKER_PATIENCE_MS = 15 * 60_000;
const MARKER_FIRST_PAUSE_MS = 100;
const MARKER_LAST_PAUSE_MS = 5_000;

/**
 * The job records (`<prefix>_jobs`) and their events: the one place that writes them. Each
 * write is a step of `JobTransitions` (the record and the event that tells of it): the record is
 * written, then its event published through `announce`, so no record changes untold and no event
 * tells of a record that was not written. Every change is a compare-and-swap against the
 * revision it was decided on; when another writer (a worker, a dispatcher, a cancel) got there
 * first, the record is read again and the change decided anew, up to 10 times. Errors other
 * than a lost race (NATS out of reach, say) are thrown; a record written whose event was not
 * stored throws `EventNotStored`. Records of ended jobs are deleted for good by retention
 * through erase.ts, which works on a full store too.
 */
export class JobStore {
  /**
   * `keys` removes a key's messages (for `withdraw` on a full store) and marks it deleted;
   * `announce` publishes a step's event (to the events stream, or through a worker's attempt).
   */
  constructor(
    private readonly kv: KV,
    private readonly keys: JobKeys,
    private readonly announce: Announce,
  ) {}

  /** This store, its events published through `announce` instead (a worker's attempt numbers and redacts its own). */
  announcingWith(announce: Announce): JobStore {
    return new JobStore(this.kv, this.keys, announce);
  }

  async read(id: string): Promise<JobHandle | null> {
    const found = await getJson(this.kv, id, JobRecord, "job record");
    return found && { record: found.value, revision: found.revision };
  }

  /** Writes a new job's first record (`JobTransitions.admit`) and its event; null when a record with its id exists already. */
  async create(step: JobStep): Promise<JobHandle | null> {
    const { record } = step;
    let handle: JobHandle;
    try {
      handle = { record, revision: await this.kv.create(record.id, JSON.stringify(record)) };
    } catch (err) {
      if (isRevisionConflict(err)) return null;
      throw err;
    }
    await this.told(step, handle);
    return handle;
  }

  /**
   * Removes a record as it was written (compare-and-swap on its revision): an admission that
   * could not finish takes back its job. True when removed; false when it changed meanwhile.
   *
   * It works on a full store too, which refuses the delete marker a KV delete writes: then the
   * revision itself is removed (which writes nothing, and frees the record's bytes), and the
   * marker is written in the room that freed, so watchers forget the job. Should the store fill
   * again first, the record is gone all the same (a read finds nothing), and the marker is tried
   * again in the background until there is room (for 15 minutes): till then, watchers that saw
   * the record count it.
   */
  async withdraw(handle: JobHandle): Promise<boolean> {
    const id = handle.record.id;
    try {
      await this.kv.delete(id, { previousSeq: handle.revision });
      return true;
    } catch (err) {
      if (isRevisionConflict(err)) return false;
      if (!isStorageFull(err)) throw err;
    }
    await this.keys.removeRevision(id, handle.revision);
    // A later revision stands (with one kept per key, it had already replaced this one): changed meanwhile.
    if (await this.read(id)) return false;
    await this.markDeleted(id);
    return true;
  }

  /**
   * Writes the delete marker of a purged record; while the store has no room, tries again in the
   * background. Stops on any other answer: a record of that id written since (the same
   * idempotency key finishing its admission) refuses it, rightly.
   */
  private async markDeleted(id: string): Promise<void> {
    const deadline = Date.now() + MARKER_PATIENCE_MS;
    const attempt = (pauseMs: number): Promise<void> =>
      this.keys.markDeleted(id).catch((err: unknown) => {
        if (!isStorageFull(err) || Date.now() + pauseMs > deadline) return;
        setTimeout(() => void attempt(Math.min(pauseMs * 2, MARKER_LAST_PAUSE_MS)), pauseMs).unref();
      });
    await attempt(MARKER_FIRST_PAUSE_MS);
  }

  /**
   * Changes a job's record: `decide` gets the record as it stands and returns the step to take
   * (a `JobTransitions` function's), or null to leave it as it is; the step's event is published
   * once its record is written. Starts from `from` when the caller has just read it, else reads
   * it. A job that does not exist is left alone.
   */
  async change(from: JobHandle | string, decide: (current: JobRecord) => JobStep | null): Promise<JobChange> {
    const id = typeof from === "string" ? from : from.record.id;
    let current = typeof from === "string" ? await this.read(id) : from;
    for (let tries = 0; tries < MAX_TRIES && current; tries++) {
      const step = decide(current.record);
      if (!step) return { written: false, current };
      let handle: JobHandle | undefined;
      try {
        handle = { record: step.record, revision: await this.kv.update(id, JSON.stringify(step.record), current.revision) };
      } catch (err) {
        if (!isRevisionConflict(err)) throw err;
      }
      if (handle) {
        await this.told(step, handle);
        return { written: true, handle };
      }
      current = await this.read(id);
    }
    if (!current) return { written: false, current };
    throw new BoxcarError(ErrorCode.conflict, `job ${id} kept changing; gave up after ${MAX_TRIES} tries`);
  }

  /** Publishes the event of a step whose record is written as `handle`. */
  private async told(step: JobStep, handle: JobHandle): Promise<void> {
    if (!step.event) return;
    try {
      await this.announce(step.event);
    } catch (err) {
      throw new EventNotStored(handle, err);
    }
  }
}
