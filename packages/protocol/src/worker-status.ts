/**
 * A worker's status from its presence entry, with no schema library: the dashboard's page uses
 * it as the CLI and the dispatchers do (`@boxcar/protocol/worker-status`).
 */

/**
 * What a reader makes of a presence entry: `live` (heartbeating), `draining` (heartbeating, but
 * finishing its jobs and taking no more), `stopped` (its entry says it stopped cleanly) or `gone`
 * (no heartbeat for `MISSED_HEARTBEATS` of its heartbeat intervals: killed, frozen or cut off).
 */
export const WORKER_STATUSES = ["live", "draining", "stopped", "gone"] as const;
export type WorkerStatus = (typeof WORKER_STATUSES)[number];

/** What a worker's status is derived from: the fields of its presence entry (`WorkerInfo`) it reads. */
export interface WorkerPresence {
  readonly state: string;
  readonly heartbeatAt: string;
  readonly heartbeatMs: number;
}

/** A worker whose presence is older than this many of its heartbeats is gone. */
export const MISSED_HEARTBEATS = 3;

/** How long `info`'s worker may stay silent before it counts as gone. */
export function goneAfterMs(info: WorkerPresence): number {
  return MISSED_HEARTBEATS * info.heartbeatMs;
}

/**
 * The one place a worker's status is derived from its presence. Ages are measured on the
 * reader's clock against the worker's `heartbeatAt`, so the two clocks must agree (NTP) to well
 * within the bound.
 */
export function workerStatus(info: WorkerPresence, now: number = Date.now()): WorkerStatus {
  if (info.state === "stopped") return "stopped";
  if (now - Date.parse(info.heartbeatAt) > goneAfterMs(info)) return "gone";
  return info.state === "draining" ? "draining" : "live";
}

/** Whether the worker has heartbeated recently enough to count as alive (live or draining). */
export function isLive(info: WorkerPresence, now: number = Date.now()): boolean {
  const status = workerStatus(info, now);
  return status === "live" || status === "draining";
}
