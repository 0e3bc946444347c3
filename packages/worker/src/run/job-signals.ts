import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { JobSignal, JobSignals } from "../harness/prompt-loop.js";

/**
 * The signals an attempt's job has had (those kept in its record, then those sent while it runs),
 * in the order they came, for a prompt agent's loop to wait on (an approval). A command agent
 * reads them as files instead.
 */
export class SignalBox implements JobSignals {
  private readonly seen: JobSignal[] = [];
  private readonly waiters = new Set<() => void>();

  add(signal: JobSignal): void {
    this.seen.push(signal);
    for (const wake of [...this.waiters]) wake();
  }

  count(): number {
    return this.seen.length;
  }

  wait(match: (signal: JobSignal, index: number) => boolean, abort: AbortSignal): Promise<JobSignal> {
    return new Promise((resolve, reject) => {
      const check = () => {
        const index = this.seen.findIndex(match);
        if (index < 0) return;
        done();
        resolve(this.seen[index] as JobSignal);
      };
      const stopped = () => {
        done();
        reject(new BoxcarError(ErrorCode.cancelled, "the job ended while a tool call waited for approval"));
      };
      const done = () => {
        this.waiters.delete(check);
        abort.removeEventListener("abort", stopped);
      };
      if (abort.aborted) return stopped();
      this.waiters.add(check);
      abort.addEventListener("abort", stopped, { once: true });
      check();
    });
  }
}
