import type { Logger } from "@boxcar/common";

/**
 * Jobs with a time at which something is to be done about them, and a timer that does it: the
 * dispatcher's sweepers note each job's time as its record changes, and act once it is due.
 */
export class JobTimers {
  private readonly due = new Map<string, number>();
  private readonly timer: NodeJS.Timeout;
  private sweeping = false;
  private closed = false;

  constructor(
    intervalMs: number,
    private readonly act: (jobId: string) => Promise<void>,
    private readonly log: Logger,
    private readonly what: string,
  ) {
    this.timer = setInterval(() => void this.sweep(), intervalMs);
  }

  /** Sets (or, with undefined, clears) when `act` is due for the job. */
  set(jobId: string, at: number | undefined): void {
    if (at === undefined) this.due.delete(jobId);
    else this.due.set(jobId, at);
  }

  /** Clears the job's time; true if it had one. */
  clear(jobId: string): boolean {
    return this.due.delete(jobId);
  }

  /** Acts on the jobs due, one at a time; a sweep still going when the next is due is not doubled. */
  private async sweep(): Promise<void> {
    if (this.sweeping) return;
    this.sweeping = true;
    try {
      const now = Date.now();
      for (const [jobId, at] of this.due) {
        if (this.closed) return;
        if (at > now) continue;
        this.due.delete(jobId);
        await this.act(jobId).catch((err: unknown) => this.log.warn({ err, jobId }, `could not ${this.what}`));
      }
    } finally {
      this.sweeping = false;
    }
  }

  /** Stops: no job is acted on after this, not even by a sweep under way. */
  close(): void {
    this.closed = true;
    clearInterval(this.timer);
  }
}
