import { jsonOf, type Logger } from "@boxcar/client";
import type { Topology } from "@boxcar/fabric";
import { JobRecord } from "@boxcar/protocol";

/** Shown each record as stored (`undefined` once deleted or unreadable) with its size in bytes. */
export type JobObserver = (key: string, job: JobRecord | undefined, bytes: number) => void;

/** The dispatcher's watch on the job records. */
export interface JobWatch {
  /** Resolves once every record stored when the watch began has been shown to the observers. */
  readonly caughtUp: Promise<void>;
  stop(): void;
}

/**
 * The dispatcher's one watcher on the jobs bucket: it replays every record's latest value at
 * start, then follows changes, and shows each to the observers (expiry, handoffs, workflow
 * runs, the job index). Because it replays, a dispatcher that starts after a crash picks up
 * whatever was left.
 */
export async function watchJobs(topology: Topology, log: Logger, observers: readonly JobObserver[]): Promise<JobWatch> {
  let markCaughtUp!: () => void;
  const caughtUp = new Promise<void>((resolve) => {
    markCaughtUp = resolve;
  });
  const stored = (await topology.jsm.streams.info(`KV_${topology.names.buckets.jobs}`)).state.messages;
  if (stored === 0) markCaughtUp();
  const watch = await topology.jobs.watch();
  void (async () => {
    for await (const entry of watch) {
      const parsed = entry.operation === "PUT" ? JobRecord.safeParse(jsonOf(entry)) : undefined;
      if (parsed && !parsed.success) log.warn({ key: entry.key }, "a job record does not parse; ignoring it");
      const job = parsed?.success ? parsed.data : undefined;
      for (const observe of observers) observe(entry.key, job, entry.length);
      // The replay is over at its last entry (nothing pending behind it), or at the first change after it.
      if (entry.isUpdate || entry.delta === 0) markCaughtUp();
    }
  })();
  return { caughtUp, stop: () => watch.stop() };
}
