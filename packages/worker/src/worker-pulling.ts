import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { PoolPuller } from "./intake/pool-puller.js";
import type { RoomWaits } from "./intake/room-waits.js";
import type { Slots } from "./intake/slots.js";
import type { WorkDelivery } from "./intake/work-delivery.js";

/** Pause after a failed pull. */
const RETRY_MS = 1_000;
/** How many jobs of its sessions a worker asks for at once (each waits for its session's lock). */
const SESSION_JOBS_AT_ONCE = 16;

/** What a worker's pull loops need of it. */
export interface PullingContext {
  topology: Topology;
  workerId: string;
  log: Logger;
  slots: Slots;
  /** Its attempts that wait for room in JetStream's store: while any does, a pool's loop takes no new job. */
  roomWaits: RoomWaits;
  /** Aborted when pulling stops: the loops end. */
  signal: AbortSignal;
  /** Starts one delivered work item (`slotted`: it holds one of the slots; a job in a session holds none). */
  take(delivery: WorkDelivery, slotted: boolean): void;
}

/**
 * Pulls a pool's work while the worker runs, higher priorities first (see `PoolPuller`). Each
 * sweep asks for at most `share` jobs and only for slots it has reserved, and an idle wait
 * starts a job only in a free slot, so the worker never holds more than `concurrency` jobs.
 */
export async function pullPool(ctx: PullingContext, pool: string, share: number): Promise<void> {
  const puller = PoolPuller.ofPool(ctx.topology, pool, { log: ctx.log.child({ pool }) });
  while (!ctx.signal.aborted) {
    try {
      if (!(await sweep(ctx, puller, share))) return;
    } catch (err) {
      // NATS trouble mid-sweep, a flush cut short by a reconnect, ...: pause and go on.
      if (ctx.signal.aborted) return;
      ctx.log.warn({ err, pool }, "pulling work failed; trying again");
      await sleep(RETRY_MS, undefined, { signal: ctx.signal }).catch(() => {});
    }
  }
}

/**
 * Takes the jobs submitted to run in this worker's sessions (docs/sessions.md#jobs-in-a-session)
 * while the worker runs. They hold no slot: each session holds one already, and its lock lets
 * one of its jobs run at a time.
 */
export async function pullSessionJobs(ctx: PullingContext): Promise<void> {
  const puller = PoolPuller.ofSessions(ctx.topology, ctx.workerId, { log: ctx.log.child({ sessionJobs: true }) });
  const take = (delivery: WorkDelivery) => ctx.take(delivery, false);
  // Removed by a dispatcher that took this worker for gone (its heartbeats stalled): made again.
  let ensuring = false;
  const ensureConsumer = () => {
    if (ensuring) return;
    ensuring = true;
    void ctx.topology
      .ensureWorkerConsumer(ctx.workerId)
      .catch(() => {})
      .finally(() => {
        ensuring = false;
      });
  };
  while (!ctx.signal.aborted) {
    try {
      await puller.take(SESSION_JOBS_AT_ONCE, take);
      await puller.waitForWork({
        signal: ctx.signal,
        offer: (delivery) => {
          take(delivery);
          return true;
        },
        onFull: () => () => {},
        onPullFailed: ensureConsumer,
      });
    } catch (err) {
      if (ctx.signal.aborted) return;
      ctx.log.warn({ err }, "pulling the jobs of this worker's sessions failed; trying again");
      ensureConsumer();
      await sleep(RETRY_MS, undefined, { signal: ctx.signal }).catch(() => {});
    }
  }
}

/**
 * One sweep for the slots free now, then a wait for work if it left any free; false once the
 * worker takes no more. Neither starts while an attempt of the worker waits for room in
 * JetStream's store (a new job would need room too): an item that comes meanwhile goes back.
 */
async function sweep(ctx: PullingContext, puller: PoolPuller, share: number): Promise<boolean> {
  await ctx.roomWaits.none(ctx.signal);
  const reserved = await ctx.slots.acquire(share);
  if (reserved === 0) return false;
  // Counted as they come: a sweep that fails half-way still hands its slots to the jobs it took.
  let taken = 0;
  try {
    await puller.take(reserved, (delivery) => {
      taken += 1;
      ctx.take(delivery, true);
    });
  } finally {
    ctx.slots.release(reserved - taken);
  }
  if (taken < reserved) {
    await puller.waitForWork({
      signal: ctx.signal,
      offer: (delivery) => {
        if (ctx.roomWaits.any || !ctx.slots.tryAcquire()) return false;
        ctx.take(delivery, true);
        return true;
      },
      // No free slot, or an attempt starts waiting for room: the wait ends.
      onFull: (full) => {
        const slots = ctx.slots.onFull(full);
        const room = ctx.roomWaits.onWaiting(full);
        return () => {
          slots();
          room();
        };
      },
    });
  }
  return true;
}
