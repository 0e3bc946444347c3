import type { Logger } from "@boxcar/client";
import { jobEvent, nowIso, publishEvent, storedMessages, type Topology } from "@boxcar/fabric";
import { JobTransitions, parseWith, WorkItem } from "@boxcar/protocol";
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";
import type { WorkerDirectory } from "./worker-directory.js";

/**
 * How old a worker's consumer must be before a worker with no presence at all counts as gone: a
 * worker makes it before it first writes its presence.
 */
const NEW_CONSUMER_GRACE_MS = 120_000;

/**
 * Settles the jobs left for sessions whose worker is gone (docs/sessions.md#jobs-in-a-session).
 * Such a job's work item waits on its worker's own consumer (`Topology.ensureWorkerConsumer`),
 * which nothing else takes: each sweep finds the consumers of workers that are neither live
 * nor draining, ends their jobs `failed` with `session_lost` (by compare-and-swap, so several
 * dispatchers end a job once, and a job that ended is left as it is), removes their items, and
 * then the consumer. While all is well a sweep costs one consumer list.
 */
export class LostSessionWork {
  private readonly timer: NodeJS.Timeout;
  private sweeping: Promise<number> | undefined;

  constructor(
    private readonly topology: Topology,
    private readonly workers: WorkerDirectory,
    private readonly log: Logger,
    intervalMs: number,
    private readonly onFailed: (jobId: string) => void = () => {},
  ) {
    this.timer = setInterval(
      () => void this.sweep().catch((err: unknown) => log.warn({ err }, "could not look for the jobs of lost sessions")),
      intervalMs,
    );
  }

  /** Sweeps once; resolves with how many jobs it ended. */
  sweep(): Promise<number> {
    this.sweeping ??= this.sweepOnce().finally(() => {
      this.sweeping = undefined;
    });
    return this.sweeping;
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    await this.sweeping?.catch(() => {});
  }

  private async sweepOnce(): Promise<number> {
    const { jsm, names } = this.topology;
    let failed = 0;
    for await (const info of jsm.consumers.list(names.streams.work)) {
      const workerId = names.workerOfConsumer(info.name);
      if (workerId === undefined) continue;
      const status = this.workers.statusOf(workerId);
      if (status === "live" || status === "draining") continue;
      if (status === undefined && Date.now() - Date.parse(info.created) < NEW_CONSUMER_GRACE_MS) continue;
      failed += await this.settle(workerId);
      await jsm.consumers.delete(names.streams.work, info.name).catch((err: unknown) => {
        if (!isGone(err)) throw err;
      });
      this.log.info({ workerId }, "removed the sessions' consumer of a worker that is gone");
    }
    return failed;
  }

  /** Ends the jobs waiting for `workerId`'s sessions and removes their items; resolves with how many it ended. */
  private async settle(workerId: string): Promise<number> {
    const { topology } = this;
    const { jsm, names } = topology;
    let failed = 0;
    for await (const stored of storedMessages(jsm, names.streams.work, names.subjects.sessionWork(workerId))) {
      const { jobId } = parseWith(WorkItem, stored.json(), "work item");
      const change = await topology.jobStore.change(jobId, (job) => JobTransitions.loseSession(job, workerId, nowIso()));
      if (change.written) {
        const job = change.handle.record;
        failed += 1;
        this.onFailed(jobId);
        await publishEvent(topology, jobEvent(job, "failed", { ...(job.error ? { error: job.error, message: job.error.message } : {}) }));
        this.log.warn({ jobId, workerId }, "a job in a session ended: the session's worker is gone");
      }
      await jsm.streams.deleteMessage(names.streams.work, stored.seq, false).catch((err: unknown) => {
        if (!isGone(err)) throw err;
      });
    }
    return failed;
  }
}

/** Removed already (by another dispatcher): 10057 is the server's "no message found" on delete, 10014 "consumer not found". */
function isGone(err: unknown): boolean {
  return (
    err instanceof JetStreamApiError &&
    (err.code === JetStreamApiCodes.NoMessageFound || err.code === JetStreamApiCodes.ConsumerNotFound || err.code === 10057)
  );
}
