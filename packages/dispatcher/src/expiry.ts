import { getJson, type Logger, nowIso, publishEvent, type Topology } from "@boxcar/client";
import { ErrorCode, JobRecord } from "@boxcar/protocol";
import { jobEvent } from "./admission.js";

/**
 * Ends `expired` the jobs that were not started within their queue timeout, even when no
 * worker ever pulls them: one watcher on the jobs bucket keeps the waiting jobs' deadlines,
 * and a timer expires the ones due (compare-and-swap, so several dispatchers expire a job once).
 */
export class ExpirySweeper {
  private readonly deadlines = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private stopWatch: (() => void) | undefined;

  private constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
  ) {}

  static async start(topology: Topology, log: Logger, intervalMs: number): Promise<ExpirySweeper> {
    const sweeper = new ExpirySweeper(topology, log);
    const watch = await topology.jobs.watch();
    sweeper.stopWatch = () => watch.stop();
    void (async () => {
      for await (const entry of watch) {
        const parsed = entry.operation === "PUT" ? JobRecord.safeParse(entry.json()) : undefined;
        const job = parsed?.success ? parsed.data : undefined;
        if (job?.expiresAt && (job.state === "queued" || job.state === "accepted"))
          sweeper.deadlines.set(job.id, Date.parse(job.expiresAt));
        else sweeper.deadlines.delete(entry.key);
      }
    })();
    sweeper.timer = setInterval(() => void sweeper.sweep(), intervalMs);
    return sweeper;
  }

  private async sweep(): Promise<void> {
    const now = Date.now();
    for (const [id, deadline] of this.deadlines) {
      if (deadline > now) continue;
      this.deadlines.delete(id);
      await expire(this.topology, id).catch((err: unknown) => this.log.warn({ err, jobId: id }, "could not expire a job"));
    }
  }

  close(): void {
    clearInterval(this.timer);
    this.stopWatch?.();
  }
}

/** Ends a job that is still waiting past its deadline; a job that started meanwhile is left alone. */
async function expire(topology: Topology, id: string): Promise<void> {
  const found = await getJson(topology.jobs, id, JobRecord, "job record");
  if (!found || (found.value.state !== "queued" && found.value.state !== "accepted")) return;
  const job = found.value;
  const expired: JobRecord = {
    ...job,
    state: "expired",
    finishedAt: nowIso(),
    error: { code: ErrorCode.expired, message: `not started before ${job.expiresAt}: no worker of pool ${job.pool} took it in time` },
  };
  try {
    await topology.jobs.update(id, JSON.stringify(expired), found.revision);
  } catch {
    return; // a worker claimed it (or it was cancelled) in the meantime
  }
  await publishEvent(topology, jobEvent(expired, "expired"));
}
