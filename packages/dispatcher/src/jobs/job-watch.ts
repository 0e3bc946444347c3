import { jsonOf, type Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { JobRecord } from "@boxcar/protocol";
import { type BucketReplay, replayBucket } from "./bucket-replay.js";

/** Shown each record as stored (`undefined` once deleted or unreadable) with its size in bytes. */
export type JobObserver = (key: string, job: JobRecord | undefined, bytes: number) => void;

/** The dispatcher's watch on the job records. */
export type JobWatch = BucketReplay;

/**
 * The dispatcher's one watcher on the jobs bucket: it replays every record's latest value at
 * start, then follows changes, and shows each to the observers (expiry, handoffs, workflow
 * runs, the job index). Because it replays, a dispatcher that starts after a crash picks up
 * whatever was left.
 */
export async function watchJobs(topology: Topology, log: Logger, observers: readonly JobObserver[]): Promise<JobWatch> {
  return replayBucket(topology, "jobs", (entry) => {
    const parsed = entry.operation === "PUT" ? JobRecord.safeParse(jsonOf(entry)) : undefined;
    if (parsed && !parsed.success) log.warn({ key: entry.key }, "a job record does not parse; ignoring it");
    const job = parsed?.success ? parsed.data : undefined;
    for (const observe of observers) observe(entry.key, job, entry.length);
  });
}
