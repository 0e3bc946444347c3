import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { getJson, nowIso, storedMessages } from "@boxcar/fabric/internal";
import { WorkerInfo, type WorkerStatus, WorkItem, workerStatus } from "@boxcar/protocol";
import { JobTransitions } from "@boxcar/protocol/internal";
import { JetStreamApiCodes, JetStreamApiError, type StoredMsg } from "@nats-io/jetstream";
import type { WorkerDirectory } from "../catalog/worker-directory.js";
import { Sweep } from "../loops/sweep.js";

/**
 * How old a worker's consumer must be before a worker with no presence at all counts as gone: a
 * worker makes it before it first writes its presence.
 */
const NEW_CONSUMER_GRACE_MS = 120_000;

/**
 * Settles the jobs left for sessions whose worker is gone (docs/sessions.md#jobs-in-a-session).
 * Such a job's work item waits on its worker's own subject and consumer
 * (`Topology.ensureWorkerConsumer`), which nothing else takes: each sweep finds the workers
 * with a consumer or items there that are neither live nor draining, removes the consumer, ends
 * their jobs `failed` with `session_lost` (by compare-and-swap, so several dispatchers end a job
 * once, and a job that ended is left as it is) and removes their items. A worker that was only
 * slow to heartbeat makes its consumer again. While all is well a sweep costs one consumer list
 * and one stream info.
 */
export class LostSessionSweep {
  private readonly sweeps: Sweep<number>;

  constructor(
    private readonly topology: Topology,
    private readonly workers: WorkerDirectory,
    private readonly log: Logger,
    intervalMs: number,
    private readonly onFailed: (jobId: string) => void = () => {},
  ) {
    this.sweeps = new Sweep({
      pass: () => this.sweepOnce(),
      intervalMs,
      onError: (err) => log.warn({ err }, "could not look for the jobs of lost sessions"),
    });
  }

  start(): void {
    this.sweeps.start();
  }

  /** Sweeps now; resolves with how many jobs it ended. */
  run(): Promise<number> {
    return this.sweeps.run();
  }

  stop(): Promise<void> {
    return this.sweeps.stop();
  }

  private async sweepOnce(): Promise<number> {
    const { jsm, names } = this.topology;
    const stream = names.streams.work;
    // The workers with a consumer, and those with items waiting (a consumer removed before its
    // items were settled, or items published to a worker that made none).
    const consumers = new Map<string, string>();
    for await (const info of jsm.consumers.list(stream)) {
      const workerId = names.workerOfConsumer(info.name);
      if (workerId !== undefined) consumers.set(workerId, info.created);
    }
    // `work.@<worker>` subjects are one token after `work.`, as a pool's normal-priority ones are.
    const prefix = names.subjects.sessionWork("");
    const subjects = (await jsm.streams.info(stream, { subjects_filter: `${names.prefix}.work.*` })).state.subjects ?? {};
    const waiting = Object.keys(subjects).filter((subject) => subject.startsWith(prefix));
    const workers = new Set([...consumers.keys(), ...waiting.map((subject) => subject.slice(prefix.length))]);
    let failed = 0;
    for (const workerId of workers) {
      // The directory first (no request while all is well), then the presence itself: the
      // directory may lag, right after this dispatcher started above all.
      if (isAlive(this.workers.statusOf(workerId))) continue;
      const presence = await getJson(this.topology.workers, workerId, WorkerInfo, "worker");
      const status = presence ? workerStatus(presence.value) : undefined;
      if (isAlive(status)) continue;
      // A worker makes its consumer before its first presence: a new one is given time.
      const created = consumers.get(workerId);
      if (status === undefined && created !== undefined && Date.now() - Date.parse(created) < NEW_CONSUMER_GRACE_MS) continue;
      // The consumer first: an item published meanwhile is found by the next sweep, by its subject.
      if (created !== undefined) {
        await jsm.consumers.delete(stream, names.workerConsumer(workerId)).catch((err: unknown) => {
          if (!isGone(err)) throw err;
        });
        this.log.info({ workerId }, "removed the sessions' consumer of a worker that is gone");
      }
      failed += await this.settle(workerId);
    }
    return failed;
  }

  /** Ends the jobs waiting for `workerId`'s sessions and removes their items; resolves with how many it ended. */
  private async settle(workerId: string): Promise<number> {
    const { topology } = this;
    const { jsm, names } = topology;
    let failed = 0;
    for await (const stored of storedMessages(jsm, names.streams.work, names.subjects.sessionWork(workerId))) {
      // One item that cannot be settled (unreadable, say) does not hold up the others; an unreadable one is removed.
      const ended = await this.settleItem(workerId, stored).catch((err: unknown) => {
        this.log.warn({ err, seq: stored.seq, workerId }, "could not settle the work item of a lost session's job");
        return false;
      });
      if (ended) failed += 1;
    }
    return failed;
  }

  /** Ends one item's job (`session_lost`) unless it ended already, then removes the item; true when it ended the job. */
  private async settleItem(workerId: string, stored: StoredMsg): Promise<boolean> {
    const { topology } = this;
    const { seq } = stored;
    let body: unknown;
    try {
      body = stored.json();
    } catch {
      body = undefined; // not JSON: removed below
    }
    const item = WorkItem.safeParse(body);
    let ended = false;
    if (item.success) {
      const { jobId } = item.data;
      const change = await topology.jobStore.change(jobId, (job) => JobTransitions.loseSession(job, workerId, nowIso()));
      if (change.written) {
        ended = true;
        this.onFailed(jobId);
        this.log.warn({ jobId, workerId }, "a job in a session ended: the session's worker is gone");
      }
    }
    await topology.jsm.streams.deleteMessage(topology.names.streams.work, seq, false).catch((err: unknown) => {
      if (!isGone(err)) throw err;
    });
    return ended;
  }
}

function isAlive(status: WorkerStatus | undefined): boolean {
  return status === "live" || status === "draining";
}

/** Removed already (by another dispatcher): 10057 is the server's "no message found" on delete, 10014 "consumer not found". */
function isGone(err: unknown): boolean {
  return (
    err instanceof JetStreamApiError &&
    (err.code === JetStreamApiCodes.NoMessageFound || err.code === JetStreamApiCodes.ConsumerNotFound || err.code === 10057)
  );
}
