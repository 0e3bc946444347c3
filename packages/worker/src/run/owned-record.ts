import type { JobHandle, JobStore } from "@boxcar/fabric/internal";
import type { JobRecord } from "@boxcar/protocol";
import { type JobStep, JobTransitions } from "@boxcar/protocol/internal";

/**
 * The job's record as this attempt last wrote it, from its claim on, and the changes it may still
 * make: each a compare-and-swap that checks the attempt still owns the job (this worker, this
 * attempt). The attempt reads it (its kept signals, its deadline); the outcome writer changes it.
 */
export class OwnedRecord {
  constructor(
    private readonly jobStore: Pick<JobStore, "change">,
    private handle: JobHandle,
    private readonly workerId: string,
    readonly attempt: number,
  ) {}

  get record(): JobRecord {
    return this.handle.record;
  }

  /** Whether `record` still shows this worker and this attempt as the job's owner. */
  owns(record: JobRecord): boolean {
    return JobTransitions.isOwnedBy(record, this.workerId, this.attempt);
  }

  /** Takes `step` (a `JobTransitions` function) on the record while this attempt owns it; null once it does not. */
  async update(step: (current: JobRecord) => JobStep | null): Promise<JobRecord | null> {
    const update = await this.jobStore.change(this.handle, (current) => (this.owns(current) ? step(current) : null));
    if (!update.written) return null;
    this.handle = update.handle;
    return update.handle.record;
  }

  /** Time left before the job's overall deadline (infinite without one). */
  msToDeadline(): number {
    const { deadlineAt } = this.handle.record;
    return deadlineAt ? Date.parse(deadlineAt) - Date.now() : Number.POSITIVE_INFINITY;
  }
}
