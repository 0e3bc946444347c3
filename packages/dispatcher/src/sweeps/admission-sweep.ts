import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { DUPLICATE_WINDOW_MS, getJson } from "@boxcar/fabric/internal";
import { JobRecord } from "@boxcar/protocol";
import type { AdmissionContext } from "../intake/admission.js";
import { publishWorkItem } from "../jobs/work-items.js";
import { JobTimers } from "../loops/job-timers.js";
import type { RecoverySweep } from "./work-recovery.js";

/** How long a new job may wait before its work item is published again, in case it never was. */
const GRACE_MS = 5_000;
/** Republishing stops this long before the stream's duplicate window closes, so the server still drops a copy. */
const MARGIN_MS = 15_000;

/**
 * Finishes admissions a dispatcher crash cut short. `admit` writes the job record, then
 * publishes its work item; a dispatcher that dies in between leaves a `queued` job with no work.
 * Every dispatcher is shown each new job (by the jobs watcher); one still waiting at attempt 0
 * after a few seconds gets its work item published again under the same message id, which the
 * work stream drops when the first one did arrive. This works within the stream's duplicate
 * window (2 min); an older orphan is `RecoverySweep`'s. A job this dispatcher admitted itself is
 * left alone once its work item is stored ({@link workPublished}), and another's only when the
 * work stream holds fewer items than there are jobs queued or running: under a backlog, that
 * spares every queued job a second read and publish.
 */
export class AdmissionSweep {
  private readonly timers: JobTimers;
  /** Jobs whose work item this dispatcher stored before the watcher showed their record. */
  private readonly published = new Set<string>();

  constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
    intervalMs: number,
    private readonly ctx: Pick<AdmissionContext, "agents" | "signer" | "workers" | "limits">,
    private readonly work: Pick<RecoverySweep, "workMissing">,
  ) {
    this.timers = new JobTimers(intervalMs, (id) => this.republish(id), log, "check a queued job's work item");
  }

  /** Notes a job record's latest value (undefined: the record was deleted). */
  observe(key: string, job: JobRecord | undefined): void {
    if (this.published.delete(key)) return;
    const waiting = job?.state === "queued" && job.attempt === 0 && withinWindow(job);
    this.timers.set(key, waiting ? Date.parse(job.createdAt) + GRACE_MS : undefined);
  }

  /** Admission stored the job's work item: nothing is left to finish for it. */
  workPublished(id: string): void {
    if (!this.timers.clear(id)) this.published.add(id);
  }

  private async republish(id: string): Promise<void> {
    // Every job queued or running has its item, as far as the work stream's size tells: nothing
    // to finish (under a backlog admitted by another dispatcher, that spares every job a read
    // and a second publish).
    if (!(await this.work.workMissing())) return;
    const job = (await getJson(this.topology.jobs, id, JobRecord, "job record"))?.value;
    if (job?.state !== "queued" || job.attempt !== 0 || !withinWindow(job)) return;
    await publishWorkItem(this.topology, job, await this.ctx.agents.get(job.agent), this.ctx);
    this.log.debug({ jobId: id }, "work item published again (dropped by the stream if it was there)");
  }

  start(): void {
    this.timers.start();
  }

  /** Publishes again now the items of the jobs due. */
  run(): Promise<void> {
    return this.timers.run();
  }

  stop(): Promise<void> {
    return this.timers.stop();
  }
}

/** True while a second copy of the job's work item would still be dropped by the work stream. */
const withinWindow = (job: JobRecord): boolean => Date.now() - Date.parse(job.createdAt) < DUPLICATE_WINDOW_MS - MARGIN_MS;
