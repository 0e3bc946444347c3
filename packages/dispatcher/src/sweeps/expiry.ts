import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { nowIso } from "@boxcar/fabric/internal";
import type { JobRecord } from "@boxcar/protocol";
import { JobTransitions } from "@boxcar/protocol/internal";
import { removeWaitingMarker } from "../jobs/jobs.js";
import { JobTimers } from "../loops/job-timers.js";

/**
 * Ends `expired` the jobs that were not started within their queue timeout, even when no
 * worker ever pulls them: it is shown every job record (by the dispatcher's one watcher on the
 * jobs bucket), keeps the waiting jobs' deadlines, and a timer expires the ones due
 * (compare-and-swap, so several dispatchers expire a job once).
 */
export class ExpirySweep {
  private readonly timers: JobTimers;

  /** Every `intervalMs` it expires the jobs due; `onEnded` hears of each job this dispatcher ended, `expired` or `timed_out`. */
  constructor(topology: Topology, log: Logger, intervalMs: number, onEnded: (job: JobRecord) => void = () => {}) {
    this.timers = new JobTimers(intervalMs, (id) => expire(topology, id, onEnded), log, "expire a job");
  }

  /** Notes a job record's latest value (undefined: the record was deleted). */
  observe(key: string, job: JobRecord | undefined): void {
    this.timers.set(key, job && JobTransitions.waitingDueAt(job));
  }

  start(): void {
    this.timers.start();
  }

  /** Expires the jobs due now. */
  run(): Promise<void> {
    return this.timers.run();
  }

  stop(): Promise<void> {
    return this.timers.stop();
  }
}

/**
 * Ends a job still waiting past its queue timeout (`expired`) or its overall deadline
 * (`timed_out`, e.g. while it waits for a retry); a job that started meanwhile is left alone.
 */
async function expire(topology: Topology, id: string, onEnded: (job: JobRecord) => void): Promise<void> {
  const change = await topology.jobStore.change(id, (job) => JobTransitions.expire(job, nowIso()));
  if (!change.written) return;
  const expired = change.handle.record;
  onEnded(expired);
  // A job that waited as a marker leaves none to count as work.
  await removeWaitingMarker(topology, expired);
}
