import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { nowIso } from "@boxcar/fabric/internal";
import { BoxcarError, ErrorCode, isTerminal, type SandboxInfo, toErrorInfo, type WorkItem } from "@boxcar/protocol";
import { JobTransitions } from "@boxcar/protocol/internal";
import type { AttemptLease } from "../sandbox/lifeline.js";
import type { WorkerMetrics } from "../worker-metrics.js";
import type { Redactor } from "../workspace/redactor.js";
import { type FinalOutcome, failedOutcome, type Outcome, type StopReason, withUsage } from "./attempt-outcome.js";
import type { JobEvents } from "./job-events.js";
import type { OwnedRecord } from "./owned-record.js";
import { planRetry, type RetryPlan } from "./retry-plan.js";
import { type RoomWait, RoomWaitStoppedError } from "./room-wait.js";

/**
 * What becomes of the work item once the outcome is written: acknowledged (the job is done
 * with it), handed back to JetStream (after `delayMs`: a retry's backoff; at once for another
 * worker), or left alone (another attempt owns the job, or may soon).
 */
export type Settlement = { kind: "ack" } | { kind: "nak"; delayMs?: number } | { kind: "leave" };

/** What the outcome writer is given by the delivery that claimed the job. */
export interface OutcomeWriterContext {
  topology: Topology;
  workerId: string;
  metrics: WorkerMetrics | undefined;
  item: WorkItem;
  /** The job's record as the attempt last wrote it: every write checks the attempt still owns it. */
  owned: OwnedRecord;
  events: JobEvents;
  log: Logger;
  /** Takes the agent's secrets out of the outcome before anything of it is written. */
  redactor: Redactor;
  /** The sandbox decided at the claim, kept in the record and the outcome event. */
  sandbox: SandboxInfo | undefined;
  /** A job in a session: handed back, it fails instead (nothing else can run it). */
  inSession: boolean;
  /** The attempt's hold on its job: past it, the attempt writes nothing. */
  attemptLease: AttemptLease | undefined;
  /** When the attempt claimed the job (performance.now()), for its metrics. */
  claimedAt: number;
  /** The record refused for want of storage waits for room here, for as long as the run goes on. */
  room: RoomWait;
  /** Why the run was stopped, if it was. */
  stopReason(): StopReason | undefined;
}

/**
 * The end of an attempt: its outcome written to the job's record (final, requeued, retrying or
 * dead, by the job's transitions) and announced by its event, its figures to the metrics, a
 * dead job kept in the dead-letter stream. The work item stays the delivery's: the writer says
 * what to do with it.
 */
export class OutcomeWriter {
  private readonly item: WorkItem;
  private readonly jobId: string;
  private readonly topology: Topology;
  private readonly owned: OwnedRecord;
  private readonly events: JobEvents;
  private readonly log: Logger;

  constructor(private readonly ctx: OutcomeWriterContext) {
    this.item = ctx.item;
    this.jobId = ctx.item.jobId;
    this.topology = ctx.topology;
    this.owned = ctx.owned;
    this.events = ctx.events;
    this.log = ctx.log;
  }

  /**
   * Writes how the attempt ended (the record by compare-and-swap while this attempt owns the job,
   * then its event) and says what becomes of the work item. A failure the retry policy covers is
   * retried or buries the job; an attempt that no longer owns the job writes nothing. A record the
   * store has no room for waits for it; should the worker stop (or the lease lapse) meanwhile, the
   * record is left as it is and the work item handed back, as for a job stopped while it runs.
   */
  async write(reported: Outcome): Promise<Settlement> {
    try {
      return await this.written(reported);
    } catch (err) {
      if (!(err instanceof RoomWaitStoppedError)) throw err;
      this.log.warn(
        { reason: this.ctx.stopReason() },
        "stopped while JetStream's store had no room for the job's record; leaving it as it is and handing the work item back",
      );
      return { kind: "nak" };
    }
  }

  private async written(reported: Outcome): Promise<Settlement> {
    // Everything the attempt reports comes from here (its result, handoff, artifacts' names,
    // error, usage): redacted once, whatever field it is in.
    let outcome = this.ctx.redactor.json(reported);
    // Past its lease, another attempt may own the job: this one writes nothing.
    if (this.ctx.attemptLease?.lapsed()) outcome = { kind: "fenced" };
    if (outcome.kind === "requeue" && this.ctx.inSession) {
      // Nothing else can run it: the session closes with this worker.
      const error = new BoxcarError(
        ErrorCode.sessionLost,
        `worker ${this.ctx.workerId} stopped while the job ran; session ${this.item.session} closes with it`,
      );
      outcome = withUsage(failedOutcome(toErrorInfo(error), undefined), outcome.usage);
    }
    if (outcome.kind === "fenced") {
      this.log.warn(
        { reason: this.ctx.stopReason() },
        "another attempt owns the job now, or may soon; leaving its record and work item alone",
      );
      return { kind: "leave" };
    }
    if (outcome.kind === "final" && (outcome.state === "failed" || outcome.state === "timed_out")) {
      const attempt = this.events.attempt;
      const plan = planRetry(
        this.item.retry,
        { ...outcome, state: outcome.state },
        attempt,
        this.owned.record.attemptsAllowed ?? 1,
        this.owned.msToDeadline(),
      );
      if (plan.kind !== "final") return this.retryOrBury(outcome, outcome.state, plan);
      if (plan.note) outcome = { ...outcome, message: `${outcome.message ?? outcome.state}; ${plan.note}` };
    }
    const now = nowIso();
    const update =
      outcome.kind === "requeue"
        ? await this.update((current) => JobTransitions.handBack(current, now))
        : await this.update((current) => JobTransitions.finish(current, this.attemptEnd(outcome, outcome.state, now)));
    if (!update) return this.leave();

    this.attemptEnded(outcome.kind === "requeue" ? "requeued" : outcome.state, outcome.kind === "final" ? outcome : undefined);
    if (outcome.kind === "final") this.ctx.metrics?.jobEnded(this.item.agent.name, outcome.state, update.createdAt);
    if (outcome.kind === "requeue") {
      this.log.info({}, "job handed back to the queue");
      return { kind: "nak" };
    }
    this.log.info({ state: outcome.state, error: outcome.error }, "job finished");
    return { kind: "ack" };
  }

  /** Takes `step` on the record while this attempt owns it (`OwnedRecord.update`), waiting for room while the store has none. */
  private update(step: Parameters<OwnedRecord["update"]>[0]): ReturnType<OwnedRecord["update"]> {
    return this.ctx.room.store("the job's record", () => this.owned.update(step), { bounded: false });
  }

  private attemptEnded(name: string, outcome: FinalOutcome | undefined): void {
    this.ctx.metrics?.attemptEnded(this.item.agent.name, this.owned.record.pool, name, {
      ms: performance.now() - this.ctx.claimedAt,
      cpuMs: outcome?.result?.usage?.cpuMs,
      artifactBytes: outcome?.artifacts.reduce((sum, a) => sum + a.size, 0) ?? 0,
    });
  }

  /**
   * A failed attempt the retry policy covers: back to the queue after a backoff (the work item is
   * redelivered then), or, attempts exhausted, the job ends `dead` and its record goes to the
   * dead-letter stream. Either way the attempt is kept in the record's history.
   */
  private async retryOrBury(
    outcome: FinalOutcome,
    state: "failed" | "timed_out",
    plan: RetryPlan & { kind: "retry" | "dead" },
  ): Promise<Settlement> {
    const now = nowIso();
    const attempt = this.events.attempt;
    const ended = {
      attempt,
      state,
      workerId: this.ctx.workerId,
      finishedAt: now,
      ...(outcome.error ? { error: outcome.error } : {}),
    };
    const update = await this.update((current) => JobTransitions.endAttempt(current, ended, this.attemptEnd(outcome, state, now), plan));
    if (!update) return this.leave();
    this.attemptEnded(plan.kind === "retry" ? "retrying" : "dead", outcome);
    if (plan.kind === "dead") this.ctx.metrics?.jobEnded(this.item.agent.name, "dead", update.createdAt);
    if (plan.kind === "retry") {
      this.log.info({ delayMs: plan.delayMs, error: outcome.error }, "attempt failed; retrying");
      return { kind: "nak", delayMs: plan.delayMs };
    }
    await this.topology.js
      .publish(this.topology.names.subjects.dead(update.agent), JSON.stringify(update))
      .catch((err: unknown) => this.log.error({ err }, "could not keep the dead job in the dead-letter stream"));
    this.log.warn({ error: outcome.error }, "job is dead: its attempts are exhausted");
    return { kind: "ack" };
  }

  private attemptEnd(outcome: FinalOutcome, state: JobTransitions.AttemptState, now: string): JobTransitions.AttemptEnd {
    const { retryAfterMs, usage, message } = outcome;
    return {
      ...(message !== undefined ? { message } : {}),
      ...(usage ? { usage } : {}),
      ...(retryAfterMs !== undefined ? { providerLimitedUntil: new Date(Date.parse(now) + retryAfterMs).toISOString() } : {}),
      state,
      now,
      artifacts: outcome.artifacts,
      ...(this.ctx.sandbox ? { sandbox: this.ctx.sandbox } : {}),
      ...(outcome.result ? { result: outcome.result } : {}),
      ...(outcome.error ? { error: outcome.error } : {}),
    };
  }

  /** The record changed hands: a finished job's work item is done, another attempt's is not ours. */
  private async leave(): Promise<Settlement> {
    const current = await this.topology.jobStore.read(this.jobId);
    if (!current || isTerminal(current.record.state)) {
      this.log.warn({ state: current?.record.state }, "the job ended elsewhere; dropping this attempt's outcome");
      return { kind: "ack" };
    }
    this.log.warn({ state: current.record.state, attempt: current.record.attempt }, "another attempt owns the job now; leaving it alone");
    return { kind: "leave" };
  }
}
