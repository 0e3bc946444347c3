import { jsonOf, type Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { JobRecord } from "@boxcar/protocol";
import type { KvEntry } from "@nats-io/kv";
import { type BucketReplay, replayBucket } from "./bucket-replay.js";
import type { StartingPoint } from "./index-snapshots.js";

/** Shown each record as stored (`undefined` once deleted or unreadable) with its size in bytes. */
export type JobObserver = (key: string, job: JobRecord | undefined, bytes: number) => void;

/**
 * The dispatcher's one watcher on the jobs bucket: once started, it replays every record's
 * latest value, then follows changes, and shows each to the observers (expiry, handoffs,
 * workflow runs, the job index). Because it replays, a dispatcher that starts after a crash
 * picks up whatever was left.
 *
 * Started from a snapshot of the job index (`IndexSnapshots.restore`, which gave the index its
 * settled jobs), it shows the unsettled jobs' records as they stood at the snapshot's sequence,
 * then every record written after it: each observer is shown every record it would act on.
 */
export class JobWatch {
  /** Resolves once every record stored when the watch started has been shown. */
  readonly caughtUp: Promise<void>;
  private markCaughtUp!: () => void;
  private replay: BucketReplay | undefined;
  /** The last sequence shown; known once caught up. */
  private shown = 0;
  private isCaughtUp = false;

  constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
    private readonly observers: readonly JobObserver[],
    /** Told each delete marker it shows, with its sequence. */
    private readonly onMarker?: (key: string, revision: number) => void,
  ) {
    this.caughtUp = new Promise<void>((resolve) => {
      this.markCaughtUp = resolve;
    });
  }

  /** Starts, from `from` when a snapshot gave the index its settled jobs; resolves once the watch is set. */
  async start(from?: StartingPoint): Promise<void> {
    this.replay?.stop(); // a start tried again
    if (from) {
      this.shown = from.seq;
      await this.showAsAt(from.unsettled, from.seq);
    }
    this.replay = await replayBucket(this.topology, "jobs", (entry) => this.show(entry), from?.seq);
    void this.replay.caughtUp.then(() => {
      this.isCaughtUp = true;
      this.markCaughtUp();
    });
  }

  /** The jobs bucket's last sequence every observer has been shown; undefined until caught up. */
  position(): number | undefined {
    return this.isCaughtUp ? this.shown : undefined;
  }

  /** Shows each of `ids`' records as it stood at `seq`: one written since, the replay after `seq` shows. */
  private async showAsAt(ids: readonly string[], seq: number): Promise<void> {
    for (let i = 0; i < ids.length; i += READ_AT_ONCE) {
      const entries = await Promise.all(ids.slice(i, i + READ_AT_ONCE).map((id) => this.topology.jobs.get(id)));
      for (const entry of entries) if (entry && entry.revision <= seq) this.show(entry);
    }
  }

  private show(entry: KvEntry): void {
    const parsed = entry.operation === "PUT" ? JobRecord.safeParse(jsonOf(entry)) : undefined;
    if (parsed && !parsed.success) this.log.warn({ key: entry.key }, "a job record does not parse; ignoring it");
    const job = parsed?.success ? parsed.data : undefined;
    // The record's own id where it is the key: one flat string every observer may keep. The
    // entry's key is cut from its subject each time it is read, and each cut holds the whole
    // subject: kept by three observers, that was about 150 bytes a job (a heap snapshot at 30 000).
    const key = job?.id === entry.key ? job.id : entry.key;
    for (const observe of this.observers) observe(key, job, entry.length);
    if (entry.operation !== "PUT") this.onMarker?.(entry.key, entry.revision);
    this.shown = Math.max(this.shown, entry.revision);
  }

  stop(): void {
    this.replay?.stop();
  }
}

/** How many unsettled jobs' records a start from a snapshot reads at once. */
const READ_AT_ONCE = 256;
