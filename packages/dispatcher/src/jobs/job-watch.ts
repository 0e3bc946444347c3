import { jsonOf, type Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { JobRecord } from "@boxcar/protocol";
import { type BucketReplay, replayBucket } from "./bucket-replay.js";

/** Shown each record as stored (`undefined` once deleted or unreadable) with its size in bytes. */
export type JobObserver = (key: string, job: JobRecord | undefined, bytes: number) => void;

/**
 * The dispatcher's one watcher on the jobs bucket: once started, it replays every record's
 * latest value, then follows changes, and shows each to the observers (expiry, handoffs,
 * workflow runs, the job index). Because it replays, a dispatcher that starts after a crash
 * picks up whatever was left.
 */
export class JobWatch {
  /** Resolves once every record stored when the watch started has been shown. */
  readonly caughtUp: Promise<void>;
  private markCaughtUp!: () => void;
  private replay: BucketReplay | undefined;

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

  async start(): Promise<void> {
    this.replay = await replayBucket(this.topology, "jobs", (entry) => {
      const parsed = entry.operation === "PUT" ? JobRecord.safeParse(jsonOf(entry)) : undefined;
      if (parsed && !parsed.success) this.log.warn({ key: entry.key }, "a job record does not parse; ignoring it");
      const job = parsed?.success ? parsed.data : undefined;
      // The record's own id where it is the key: one flat string every observer may keep. The
      // entry's key is cut from its subject each time it is read, and each cut holds the whole
      // subject: kept by three observers, that was about 150 bytes a job (a heap snapshot at 30 000).
      const key = job?.id === entry.key ? job.id : entry.key;
      for (const observe of this.observers) observe(key, job, entry.length);
      if (entry.operation !== "PUT") this.onMarker?.(entry.key, entry.revision);
    });
    void this.replay.caughtUp.then(this.markCaughtUp);
  }

  stop(): void {
    this.replay?.stop();
  }
}
