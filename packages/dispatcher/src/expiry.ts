import { getJson, jobEvent, type Logger, nowIso, publishEvent, type Topology } from "@boxcar/client";
import { ErrorCode, JobRecord } from "@boxcar/protocol";
import { JobTimers } from "./job-timers.js";

/**
 * Ends `expired` the jobs that were not started within their queue timeout, even when no
 * worker ever pulls them: it is shown every job record (by the dispatcher's one watcher on the
 * jobs bucket), keeps the waiting jobs' deadlines, and a timer expires the ones due
 * (compare-and-swap, so several dispatchers expire a job once).
 */
export class ExpirySweeper {
  private readonly timers: JobTimers;

  constructor(topology: Topology, log: Logger, intervalMs: number) {
    this.timers = new JobTimers(intervalMs, (id) => expire(topology, id), log, "expire a job");
  }

  /** Notes a job record's latest value (undefined: the record was deleted). */
  observe(key: string, job: JobRecord | undefined): void {
    this.timers.set(key, job && (job.state === "queued" || job.state === "accepted") ? dueAt(job) : undefined);
  }

  close(): void {
    this.timers.close();
  }
}

/** When a waiting job runs out of time: its queue timeout (first attempt only) or its overall deadline. */
function dueAt(job: JobRecord): number | undefined {
  const times = [job.attempt === 0 ? job.expiresAt : undefined, job.deadlineAt].flatMap((t) => (t ? [Date.parse(t)] : []));
  return times.length > 0 ? Math.min(...times) : undefined;
}

/**
 * Ends a job still waiting past its queue timeout (`expired`) or its overall deadline
 * (`timed_out`, e.g. while it waits for a retry); a job that started meanwhile is left alone.
 */
async function expire(topology: Topology, id: string): Promise<void> {
  const found = await getJson(topology.jobs, id, JobRecord, "job record");
  if (!found || (found.value.state !== "queued" && found.value.state !== "accepted")) return;
  const job = found.value;
  const due = dueAt(job);
  if (due === undefined || due > Date.now()) return;
  const pastDeadline = job.deadlineAt !== undefined && Date.parse(job.deadlineAt) <= Date.now();
  const expired: JobRecord = {
    ...job,
    state: pastDeadline ? "timed_out" : "expired",
    finishedAt: nowIso(),
    error: pastDeadline
      ? { code: ErrorCode.timedOut, message: `passed its deadline of ${job.deadlineAt} while waiting for attempt ${job.attempt + 1}` }
      : { code: ErrorCode.expired, message: `not started before ${job.expiresAt}: no worker of pool ${job.pool} took it in time` },
  };
  try {
    await topology.jobs.update(id, JSON.stringify(expired), found.revision);
  } catch {
    return; // a worker claimed it (or it was cancelled) in the meantime
  }
  await publishEvent(topology, jobEvent(expired, pastDeadline ? "timed_out" : "expired"));
}
