import type { Logger } from "@boxcar/common";
import { isStorageFull } from "@boxcar/fabric/internal";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { RoomWaits } from "../intake/room-waits.js";

/** The pauses between tries of a write the store refused: from 250 ms, doubling, at most 5 s (as `patiently`'s). */
const FIRST_PAUSE_MS = 250;
const LAST_PAUSE_MS = 5_000;

/** What an attempt's wait for room is given by its delivery. */
export interface RoomWaitContext {
  /** The attempt's logger (it gains the attempt's number once the job is claimed). */
  log(): Logger;
  /** How long the attempt's results wait for room at most, from the first write the store refused (`roomWaitMs`). */
  maxWaitMs: number;
  /** Time left before the job's deadline (infinite without one, or before the claim). */
  msToDeadline(): number;
  /** The worker's count of attempts that wait: it takes no new job while any does. */
  waits: RoomWaits | undefined;
}

/** How a write waits: `bounded` (the attempt's results: artifacts, output, events) or not (its record); `signal` ends it too. */
export interface StoreOptions {
  bounded: boolean;
  signal?: AbortSignal | undefined;
}

/**
 * A write given up because its run stopped while it waited for room: the worker stops, the
 * attempt's lease lapsed, or (`signal`) the attempt was stopped. Nothing of it was stored.
 */
export class RoomWaitStoppedError extends Error {
  readonly code = "room_wait_stopped";
  constructor(
    readonly what: string,
    cause: unknown,
  ) {
    super(`stopped while waiting for room in JetStream's store to store ${what}`, { cause });
    this.name = "RoomWaitStoppedError";
  }
}

/**
 * One attempt's patience with a full store (docs/deploy.md#sizing, "A full store"): a write JetStream
 * refuses for want of storage (`insufficient resources`, `isStorageFull`) is tried again, with
 * backoff, until it is stored, instead of failing the job. Retention, `boxcar clean` or an
 * operator frees room; meanwhile the attempt keeps its lease (its delivery renews it, as while
 * its agent runs, and reads work on a full store), and its worker takes no new job.
 *
 * The attempt's results (its artifacts, kept output and events) wait at most `maxWaitMs` from
 * the first write refused, and never past the job's deadline: then the write fails
 * `storage_full`, saying the store stayed full, and the attempt's other results wait no more
 * while it stays so. Its record waits with no bound but its run's: it is what ends the job, and
 * a job whose record cannot be written cannot end any other way. Every wait ends at once when
 * the run is stopped for good (`stop()`: the worker stops, or the attempt's lease lapsed), with
 * `RoomWaitStoppedError`. The wait is logged once when it starts and once when it ends.
 */
export class RoomWait {
  private readonly stopped = new AbortController();
  /** Writes waiting now. */
  private waiting = 0;
  /** When the writes now waiting started to be refused; undefined while none waits. */
  private since: number | undefined;
  /** The results waited past their bound, and the store has refused every write since. */
  private gaveUp = false;
  private endWorkerWait: (() => void) | undefined;

  constructor(private readonly ctx: RoomWaitContext) {}

  /** The run stopped for good: every wait ends, and no write waits any more. */
  stop(): void {
    this.stopped.abort();
  }

  /** Runs `step` (a write) until it is stored, waiting for room while JetStream refuses it for want of storage. */
  async store<T>(what: string, step: () => Promise<T>, opts: StoreOptions): Promise<T> {
    let pauseMs = FIRST_PAUSE_MS;
    let waited = false;
    let stored = false;
    try {
      for (;;) {
        try {
          const value = await step();
          stored = true;
          this.gaveUp = false;
          return value;
        } catch (err) {
          if (!isStorageFull(err)) throw err;
          if (this.stopped.signal.aborted || opts.signal?.aborted) throw new RoomWaitStoppedError(what, err);
          // The store stayed full past the bound, and has refused every write since: no new wait.
          if (opts.bounded && this.gaveUp) throw this.giveUp(what, err);
          const leftMs = opts.bounded ? this.msLeft() : Number.POSITIVE_INFINITY;
          if (leftMs <= 0) throw this.giveUp(what, err);
          if (!waited) {
            waited = true;
            this.startWaiting(what, err);
          }
          await pause(Math.min(pauseMs, leftMs), [this.stopped.signal, opts.signal]);
          pauseMs = Math.min(pauseMs * 2, LAST_PAUSE_MS);
        }
      }
    } finally {
      if (waited) this.stopWaiting(what, stored);
    }
  }

  /** How long the results may still wait: to the bound from the first refusal (now, if none waits), or the job's deadline if sooner. */
  private msLeft(): number {
    const bound = (this.since ?? Date.now()) + this.ctx.maxWaitMs - Date.now();
    return Math.min(bound, this.ctx.msToDeadline());
  }

  private startWaiting(what: string, err: unknown): void {
    this.waiting += 1;
    this.ctx.log().debug({ what }, "waiting for room in JetStream's store");
    if (this.waiting > 1) return;
    this.since = Date.now();
    this.endWorkerWait = this.ctx.waits?.begin();
    this.ctx
      .log()
      .warn(
        { what, err: (err as Error).message, maxWaitMs: this.ctx.maxWaitMs },
        "JetStream's store is full; waiting for room to store what the attempt must keep",
      );
  }

  private stopWaiting(what: string, stored: boolean): void {
    this.waiting -= 1;
    if (this.waiting > 0) return;
    const waitedMs = Date.now() - (this.since ?? Date.now());
    this.since = undefined;
    this.endWorkerWait?.();
    this.endWorkerWait = undefined;
    if (stored) this.ctx.log().info({ what, waitedMs }, "room in JetStream's store again; the attempt goes on");
  }

  /** The error a result gets once its wait is over: the store stayed full for the whole bound (or to the job's deadline). */
  private giveUp(what: string, cause: unknown): BoxcarError {
    const waitedMs = Date.now() - (this.since ?? Date.now());
    const until = this.ctx.msToDeadline() <= 0 ? "until the job's deadline" : `for ${spoken(Math.max(waitedMs, this.ctx.maxWaitMs))}`;
    if (!this.gaveUp) this.ctx.log().warn({ what, waitedMs }, "JetStream's store stayed full; the attempt waits for room no more");
    this.gaveUp = true;
    return new BoxcarError(ErrorCode.storageFull, `JetStream's store stayed full ${until}: ${what} could not be stored`, { cause });
  }
}

/** A wait as said in an error: whole minutes from two on, else seconds. */
function spoken(ms: number): string {
  return ms >= 120_000 ? `${Math.round(ms / 60_000)} minutes` : `${Math.round(ms / 1000)} s`;
}

/** Resolves after `ms`, or at once when one of `signals` aborts. */
function pause(ms: number, signals: readonly (AbortSignal | undefined)[]): Promise<void> {
  return new Promise((resolve) => {
    const live = signals.filter((s): s is AbortSignal => s !== undefined);
    const done = () => {
      clearTimeout(timer);
      for (const s of live) s.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    for (const s of live) s.addEventListener("abort", done, { once: true });
    if (live.some((s) => s.aborted)) done();
  });
}
