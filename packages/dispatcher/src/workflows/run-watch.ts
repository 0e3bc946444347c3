import { jsonOf } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { getJson } from "@boxcar/fabric/internal";
import { handoffPending, isTerminal, JobRecord, WorkflowRun } from "@boxcar/protocol";
import type { AdmissionContext } from "../intake/admission.js";
import { replayBucket } from "../jobs/bucket-replay.js";
import { KeyTimers } from "../loops/key-timers.js";
import { continueChain } from "./handoff.js";
import type { Runs } from "./runs.js";

/** How long a run may stay unchanged with work left before a dispatcher looks at it again. */
const RECHECK_MS = 3_000;
/** How soon a handoff decision that failed (NATS trouble) is tried again. */
const RETRY_MS = 2_000;

/**
 * Keeps chains and runs moving whatever crashes: a job that asked to hand off gets its
 * decision, a job of a run that ended moves its run on, a run left unchanged with work to do
 * (a dispatcher died between writing it and admitting its jobs) is advanced again, and a run's
 * deadline is enforced on time.
 */
export class RunFollower {
  private readonly handoffs = new Set<string>();
  /** When to look again at a run (`<run> recheck|deadline|approval`) or at a job's handoff (`<job> handoff`). */
  private readonly timers = new KeyTimers();
  private stopWatch: (() => void) | undefined;

  constructor(
    private readonly topology: Topology,
    private readonly runs: Runs,
    private readonly ctx: AdmissionContext,
  ) {}

  /** Job observer: see `JobWatch`. */
  readonly observeJob = (_key: string, job: JobRecord | undefined): void => {
    if (!job) return;
    if (handoffPending(job) && !this.handoffs.has(job.id)) {
      this.handoffs.add(job.id);
      continueChain(this.topology, job, this.ctx)
        .catch((err: unknown) => {
          this.ctx.log.error({ err, jobId: job.id }, "could not decide a handoff; trying again");
          this.schedule(job.id, "handoff", RETRY_MS);
        })
        .finally(() => this.handoffs.delete(job.id));
      return;
    }
    if (job.chain?.run && isTerminal(job.state)) void this.runs.advance(job.chain.run);
  };

  /**
   * Follows the workflows bucket (replaying every run at start), telling `observe` each run's
   * latest value and whether it has ended for good (final, no job of it going).
   */
  async start(
    observe?: (key: string, run: WorkflowRun | undefined, ended: boolean) => void,
    caughtUp?: () => void,
    onMarker?: (key: string, revision: number) => void,
  ): Promise<void> {
    const replay = await replayBucket(this.topology, "workflows", (entry) => {
      this.clearTimers(entry.key);
      if (entry.operation !== "PUT") onMarker?.(entry.key, entry.revision);
      const parsed = entry.operation === "PUT" ? WorkflowRun.safeParse(jsonOf(entry)) : undefined;
      const run = parsed?.success ? parsed.data : undefined;
      observe?.(entry.key, run, run !== undefined && !hasWorkLeft(run));
      if (!run || !hasWorkLeft(run)) return;
      this.schedule(entry.key, "recheck", RECHECK_MS);
      if (run.state === "running" && run.deadline) this.schedule(entry.key, "deadline", Date.parse(run.deadline) - Date.now());
      // An approval that waits fails at its deadline: the run is looked at then.
      const waits = Object.values(run.steps).flatMap((s) =>
        s.state === "running" && s.approval && !s.approval.decision ? [Date.parse(s.approval.deadline)] : [],
      );
      if (run.state === "running" && waits.length > 0) this.schedule(entry.key, "approval", Math.min(...waits) - Date.now());
    });
    this.stopWatch = replay.stop;
    if (caughtUp) void replay.caughtUp.then(caughtUp);
  }

  /** Looks again at a run (or, for `handoff`, at a job whose handoff is undecided) after `inMs`. */
  private schedule(id: string, why: "recheck" | "deadline" | "approval" | "handoff", inMs: number): void {
    this.timers.set(`${id} ${why}`, inMs, () => {
      if (why !== "handoff") void this.runs.advance(id);
      else void this.recheckJob(id);
    });
  }

  private async recheckJob(id: string): Promise<void> {
    try {
      this.observeJob(id, (await getJson(this.topology.jobs, id, JobRecord, "job record"))?.value);
    } catch (err) {
      this.ctx.log.warn({ err, jobId: id }, "could not read a job record; trying again");
      this.schedule(id, "handoff", RETRY_MS);
    }
  }

  private clearTimers(runId: string): void {
    for (const why of ["recheck", "deadline", "approval"]) this.timers.clear(`${runId} ${why}`);
  }

  /** Stops following the runs, and every timer. */
  stop(): void {
    this.stopWatch?.();
    this.timers.stop();
  }
}

/** A running run, or an ended one whose jobs are still going (they are to be cancelled). */
function hasWorkLeft(run: WorkflowRun): boolean {
  return (
    run.state === "running" ||
    Object.values(run.steps).some((s) => s.instances.some((i) => i.state === "running" || i.state === "starting"))
  );
}
