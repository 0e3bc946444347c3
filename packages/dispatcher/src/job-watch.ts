import { jsonOf, type Logger } from "@boxcar/client";
import type { Topology } from "@boxcar/fabric";
import { JobRecord } from "@boxcar/protocol";

/** Shown each record as stored (`undefined` once deleted or unreadable) with its size in bytes. */
export type JobObserver = (key: string, job: JobRecord | undefined, bytes: number) => void;

/**
 * The dispatcher's one watcher on the jobs bucket: it replays every record's latest value at
 * start, then follows changes, and shows each to the observers (expiry, handoffs, workflow
 * runs). Because it replays, a dispatcher that starts after a crash picks up whatever was left.
 */
export async function watchJobs(topology: Topology, log: Logger, observers: readonly JobObserver[]): Promise<{ stop(): void }> {
  const watch = await topology.jobs.watch();
  void (async () => {
    for await (const entry of watch) {
      const parsed = entry.operation === "PUT" ? JobRecord.safeParse(jsonOf(entry)) : undefined;
      if (parsed && !parsed.success) log.warn({ key: entry.key }, "a job record does not parse; ignoring it");
      const job = parsed?.success ? parsed.data : undefined;
      for (const observe of observers) observe(entry.key, job, entry.length);
    }
  })();
  return { stop: () => watch.stop() };
}
