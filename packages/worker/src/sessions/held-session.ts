/**
 * A session as the worker that holds it keeps it (`HeldSession`): its record, its sandbox, the
 * secrets and environment its commands get, its idle and lifetime timers, and its lock: the
 * command or job running in it now (`Running`) and the jobs waiting in line for it (`waitFor`
 * takes a place in that line, `handOn` gives the free lock to the first). `NotHeld` says a
 * session is not (or no longer) this worker's.
 */

import { BoxcarError, ErrorCode, type KeptOutput, type SessionRecord } from "@boxcar/protocol";
import type { SessionSandbox } from "../sandbox/sandbox.js";
import type { BackgroundProcesses } from "./background-processes.js";
import type { SessionTunnels } from "./session-tunnels.js";
import type { SessionWatches } from "./workspace-watches.js";

export interface HeldSession {
  record: SessionRecord;
  sandbox: SessionSandbox;
  secrets: Map<string, string>;
  /** The agent's own environment variables. */
  env: Record<string, string>;
  /** A snapshot is being taken (one at a time; the idle clock waits). */
  snapshotting?: boolean;
  /**
   * Paused (`sessions.pause`): its sandbox holds every process still; requests that need it
   * running are refused, its idle clock and its processes' timeouts wait, jobs wait in line.
   * `resuming`: its sandbox is being let go. `pauseEnds` closes it if it is still paused then.
   */
  paused?: { resuming: boolean; pauseEnds: NodeJS.Timeout };
  /** The command or job running now, if any: its id, how to stop it, and whether its owner cancelled it. */
  running?: Running;
  /** Jobs waiting for the lock, first come first served: each takes it as the one before it lets go. */
  waiting: Waiter[];
  /** Its processes in the background (`sessions.start`), which hold no lock. */
  background: BackgroundProcesses;
  /** The commands whose whole output is kept in the Object Store: removed when the session closes. */
  kept: { execId: string; kept: KeptOutput }[];
  /** Files being copied in parts, by path, with the size each was checked against the session's quota for. */
  copies: Map<string, number>;
  /** Its watches (`sessions.watch`), whose changes are its `file_changed` events. */
  watches: SessionWatches;
  /** Its open connections to its ports (`sessions.connect`). */
  tunnels: SessionTunnels;
  idle?: NodeJS.Timeout;
  lifetime?: NodeJS.Timeout;
  /** When bytes last went through one of its tunnels (their traffic restarts the idle clock at most once a second). */
  trafficAt?: number;
}

/** What holds a session's lock: one command, or one job. */
export interface Running {
  /** The command's id (`<session>.<n>`), or the job's. */
  execId: string;
  stop: AbortController;
  /** Its owner cancelled it (`sessions.cancel`). */
  cancelled: boolean;
  /** Why the session closed under it, if it did. */
  closedWith?: string;
}

/** A job waiting for a session's lock. */
interface Waiter {
  running: Running;
  /** The lock is its own now. */
  take(): void;
  /** It will not get it (the session closed). */
  fail(err: Error): void;
}

/** How many jobs may wait for one session's lock on its worker; more are handed back to wait in the stream. */
const MAX_WAITING_JOBS = 64;

/**
 * Waits, in line, until the session's lock is `running`'s (`handOn` gives it). Throws
 * `conflict` when too many jobs wait already or `signal` aborts first (the job is handed back),
 * and `session_lost` when the session closes meanwhile.
 */
export function waitFor(held: HeldSession, running: Running, signal: AbortSignal): Promise<void> {
  if (held.waiting.length >= MAX_WAITING_JOBS) {
    throw new BoxcarError(ErrorCode.conflict, `session ${held.record.id} has ${held.waiting.length} jobs waiting already`);
  }
  return new Promise<void>((resolve, reject) => {
    const onAbort = () => {
      held.waiting = held.waiting.filter((w) => w !== waiter);
      reject(new BoxcarError(ErrorCode.conflict, `stopped waiting for session ${held.record.id}`));
    };
    const waiter: Waiter = {
      running,
      take: () => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      },
      fail: (err) => {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      },
    };
    held.waiting.push(waiter);
    signal.addEventListener("abort", onAbort, { once: true });
    if (signal.aborted) onAbort();
  });
}

/** Gives the free lock to the first job waiting for it, if any (it holds the session from now: its idle clock stops); none while it is paused. */
export function handOn(held: HeldSession): void {
  // A paused session's lock stays free: its jobs wait until it is resumed.
  if (held.running || held.paused) return;
  const next = held.waiting.shift();
  if (!next) return;
  held.running = next.running;
  clearTimeout(held.idle);
  next.take();
}

/** The session is not held by this worker (any more). */
export class NotHeld extends BoxcarError {
  constructor(workerId: string, id: string) {
    super(ErrorCode.notFound, `worker ${workerId} holds no session ${id}`);
  }
}
