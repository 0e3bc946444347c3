import type { Logger } from "@boxcar/common";
import { Sweep } from "./sweep.js";

/**
 * Jobs with a time at which something is to be done about them, and a sweep that does it: the
 * dispatcher's sweeps note each job's time as its record changes, and every `intervalMs` the
 * jobs due are acted on, one at a time. A pass acts on no job once `stop` was called, and
 * `stop` waits for the act under way.
 */
export class JobTimers {
  private readonly due = new Map<string, number>();
  private readonly sweep: Sweep;

  constructor(
    intervalMs: number,
    private readonly act: (jobId: string) => Promise<void>,
    private readonly log: Logger,
    private readonly what: string,
  ) {
    this.sweep = new Sweep({
      pass: (signal) => this.actOnDue(signal),
      intervalMs,
      onError: (err) => log.warn({ err }, `could not ${what}`),
    });
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

  start(): void {
    this.sweep.start();
  }

  /** Acts now on the jobs due (or joins the pass under way). */
  run(): Promise<void> {
    return this.sweep.run();
  }

  stop(): Promise<void> {
    return this.sweep.stop();
  }

  private async actOnDue(signal: AbortSignal): Promise<void> {
    const now = Date.now();
    for (const [jobId, at] of this.due) {
      if (signal.aborted) return;
      if (at > now) continue;
      this.due.delete(jobId);
      await this.act(jobId).catch((err: unknown) => this.log.warn({ err, jobId }, `could not ${this.what}`));
    }
  }
}
