import { randomBytes } from "node:crypto";
import { failSpan, type Logger, SpanKind, startSpan, TRACEPARENT } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { nowIso } from "@boxcar/fabric/internal";
import {
  BoxcarError,
  ErrorCode,
  isTerminal,
  ownerOf,
  type ResolvedRuntime,
  type SandboxInfo,
  toErrorInfo,
  type WorkItem,
} from "@boxcar/protocol";
import { checkAgentPolicy, JobTransitions, resolveRuntime } from "@boxcar/protocol/internal";
import type { Msg } from "@nats-io/transport-node";
import type { RoomWaits } from "../intake/room-waits.js";
import type { WorkDelivery } from "../intake/work-delivery.js";
import { AttemptLease } from "../sandbox/lifeline.js";
import type { SandboxBackend } from "../sandbox/sandbox.js";
import type { SessionHost, SessionLease } from "../sessions/session-host.js";
import { Redactor } from "../workspace/redactor.js";
import { Attempt, type AttemptWorker } from "./attempt.js";
import type { StopReason } from "./attempt-outcome.js";
import { capableWorker, type Preflight, preflightCheck, removeEarlierAttempts, republishOutcome, takeInput } from "./job-claim.js";
import { JobEvents } from "./job-events.js";
import { AgentSignals } from "./job-signals.js";
import { OutcomeWriter, type Settlement } from "./outcome-writer.js";
import { OwnedRecord } from "./owned-record.js";
import { RoomWait } from "./room-wait.js";

/** How long a job this worker cannot run waits before JetStream offers it again. */
const HAND_BACK_DELAY_MS = 1_000;
/**
 * How long a work item whose handling failed (the cluster could not be read, say) waits before
 * JetStream offers it again: 5 s more with each delivery, at most 30 s. Each offer uses one of
 * the item's deliveries, so trouble that lasts minutes does not use them all up (with the
 * default 20 deliveries it takes about 9 minutes).
 */
const failedHandlingDelayMs = (deliveries: number): number => Math.min(30_000, 5_000 * Math.max(1, deliveries));
/** Deliveries of a work item whose record cannot be found before the item is dropped. */
const MISSING_RECORD_LOOKS = 5;
/** How long a job waits before it is offered again when too many jobs wait for its session here already. */
const SESSION_BUSY_DELAY_MS = 1_000;

/** What a delivery uses of its worker (an attempt's part of it in `AttemptWorker`). */
export interface JobRunContext extends AttemptWorker {
  /** The worker's logger. */
  log: Logger;
  /** Backends whose provider is available now. */
  capabilities(): ReadonlySet<SandboxBackend>;
  /** The pool consumer's ack wait: the message is kept alive at a third of it. */
  leaseMs: number;
  /** The sessions this worker holds: a job in one (`submit --session`) runs in its sandbox. */
  sessions: Pick<SessionHost, "lend"> | undefined;
  /** The worker's attempts that wait for room in JetStream's store: it takes no new job while any does. */
  roomWaits: RoomWaits | undefined;
}

/** What the claim hands on to its attempt and its outcome writer. */
interface Claim {
  /** The job's record as this attempt last wrote it. */
  owned: OwnedRecord;
  runtime: ResolvedRuntime;
  secrets: Map<string, string>;
  /** The sandbox decided, as the record and the `started` event show it. */
  sandbox: SandboxInfo | undefined;
  /** When this attempt claimed the job (performance.now()). */
  claimedAt: number;
  /** The attempt's span, as a W3C `traceparent` for the agent, when the job is traced. */
  traceparent: string | undefined;
}

/**
 * One delivery of one work item: claims the job (job-claim.ts), runs one attempt of it
 * (`Attempt`), has its outcome written (`OutcomeWriter`) and settles the message. Every step
 * that changes the job record is a compare-and-swap that checks this attempt still owns the
 * job. From delivery to settlement it holds the message's lease: keep-alives, the lapse watch,
 * the ack or nak; and it takes the job's cancels and signals.
 */
export class JobRun {
  readonly jobId: string;
  private readonly topology: Topology;
  private readonly abort = new AbortController();
  private readonly events: JobEvents;
  private log: Logger;
  private stopReason: StopReason | undefined;
  /** The job's record as this attempt last wrote it; set once the job is claimed. */
  private owned: OwnedRecord | undefined;
  private finishing = false;
  /** Takes the agent's secrets out of everything written of this attempt: its events, record, output, artifacts and log lines. */
  private readonly redactor = new Redactor();
  /** The signals sent to the job while this delivery has it. */
  private readonly signals: AgentSignals;
  /** A job in a session: the session's sandbox, lent for this attempt. */
  private session: SessionLease | undefined;
  /** How the attempt ended, once it has (its final state, or `requeue`, `fenced`). */
  private endedAs: string | undefined;
  /**
   * The attempt's hold on its job, from the delivery on (lifeline.ts): renewed at each confirmed
   * keep-alive; once it lapses the agent is stopped and the attempt writes nothing more.
   */
  private readonly attemptLease: AttemptLease | undefined;
  private lapseTimer: NodeJS.Timeout | undefined;
  /**
   * What the attempt must store (its events, output, artifacts and record) waits here for room
   * while JetStream's store is full, its lease kept meanwhile, instead of failing the job.
   */
  private readonly room: RoomWait;

  constructor(
    private readonly ctx: JobRunContext,
    private readonly msg: WorkDelivery,
    private item: WorkItem,
  ) {
    this.jobId = item.jobId;
    this.topology = ctx.options.topology;
    this.attemptLease = Number.isFinite(ctx.leaseMs) ? new AttemptLease(ctx.leaseMs) : undefined;
    this.log = this.redactor.logger(ctx.log.child({ jobId: item.jobId }));
    this.room = new RoomWait({
      log: () => this.log,
      maxWaitMs: ctx.options.roomWaitMs,
      msToDeadline: () => this.owned?.msToDeadline() ?? Number.POSITIVE_INFINITY,
      waits: ctx.roomWaits,
    });
    this.events = new JobEvents(
      this.topology,
      {
        jobId: item.jobId,
        owner: ownerOf(item),
        agent: item.agent.name,
        workerId: ctx.options.workerId,
        ...(item.chain?.run ? { run: item.chain.run } : {}),
      },
      this.log,
      ctx.options.eventHoldMs,
      this.redactor,
      this.room,
    );
    this.signals = new AgentSignals({ redactor: this.redactor, events: this.events, stopReason: () => this.stopReason });
  }

  /** A signal to the job (docs/flow-control.md#signals), from a dispatcher: to its agent, if it runs (`AgentSignals`). */
  signal(msg: Msg): Promise<void> {
    return this.signals.receive(msg);
  }

  /** Stops the run; the first reason decides how the job ends. */
  stop(reason: StopReason): void {
    // The worker stops, or the lease lapsed: nothing waits for room any more, whatever stopped the run first.
    if (reason === "worker_stopped" || reason === "lease_lost") this.room.stop();
    if (this.stopReason) return;
    this.stopReason = reason;
    this.signals.refuseWaiting(); // signals waiting for the sandbox are refused now
    this.log.info({ reason }, "stopping job");
    this.abort.abort();
  }

  /** Handles the message to the end; never rejects. */
  async run(): Promise<void> {
    const keepAlive = setInterval(() => this.keepAlive(), this.ctx.leaseMs / 3);
    this.watchLapse();
    try {
      await this.process();
    } catch (err) {
      const delayMs = failedHandlingDelayMs(this.msg.deliveryCount);
      this.log.error({ err, delayMs }, "job handling failed; handing the work item back");
      this.nak(delayMs);
    } finally {
      clearInterval(keepAlive);
      clearTimeout(this.lapseTimer);
      this.session?.release(this.endedAs ?? "handed back");
      // An attempt that ended without its last event (fenced, or handed back on an error) keeps the rest.
      this.events.goLive();
      // Nothing of an ended run waits for room: the worker takes jobs again once its others have room.
      this.room.stop();
    }
  }

  /**
   * The claim: reads the record, checks what can fail before anything starts (the input, the
   * worker's policy, a sandbox, the secrets; a session's sandbox), claims the job by
   * compare-and-swap, and runs the attempt of a job it claimed.
   */
  private async process(): Promise<void> {
    const found = await this.topology.jobStore.read(this.jobId);
    if (!found) {
      // Admission writes the record before the item, so a missing record is a read that came too
      // early (or a job deleted since): look a few more times before dropping the item.
      if (this.msg.deliveryCount < MISSING_RECORD_LOOKS) {
        this.log.warn({}, "no job record for this work item yet; looking again shortly");
        return this.nak(HAND_BACK_DELAY_MS);
      }
      this.log.warn({}, "no job record for this work item; dropping it");
      return this.ack();
    }
    if (this.stopReason === "worker_stopped") return this.nak();

    const taken = takeInput(this.item, found.record);
    if ("item" in taken) this.item = taken.item;
    let preflight: Preflight;
    if ("error" in taken) preflight = { ok: false, error: taken.error, otherMayRun: false };
    else if (this.item.session === undefined || isTerminal(found.record.state)) preflight = preflightCheck(this.item, this.ctx);
    else {
      const lent = await this.borrowSession(this.item.session);
      if (lent === "busy") return this.nak(SESSION_BUSY_DELAY_MS);
      preflight = lent;
    }
    // Handed back for another worker of the pool, unless it is a job of a session here (none other can run it).
    if (!preflight.ok && preflight.otherMayRun && !isTerminal(found.record.state) && !this.item.session) {
      const other = await capableWorker(this.topology, this.ctx.options.workerId, found.record.pool, this.item.agent);
      if (other) {
        // Not for this worker: hand it back (after a pause) for one that can run it.
        this.log.info({ capableWorker: other, reason: preflight.error.message }, "cannot run this job here; handing it back");
        this.nak(HAND_BACK_DELAY_MS);
        return;
      }
    }
    const now = nowIso();
    // The sandbox decision goes on the record and the `started` event before anything is created.
    const decided: SandboxInfo | undefined = !preflight.ok
      ? undefined
      : this.session
        ? { ...this.session.info, reason: preflight.runtime.reason }
        : { kind: preflight.runtime.kind, id: `sbx-${randomBytes(6).toString("hex")}`, reason: preflight.runtime.reason };
    // A delivery whose lease lapsed meanwhile (its worker frozen) is another's by now: no claim.
    if (this.attemptLease?.lapsed()) return;
    // The record's changes from the claim on are told by this attempt's events (numbered, redacted):
    // the claim's `started` is stored before the agent runs, so an attempt that ran has its start in
    // the history even when its worker dies right after (a chaos run in CI found one that had none).
    const jobStore = this.topology.jobStore.announcingWith((event) => this.events.announce(event));
    const claim = await jobStore.change(found, (current) =>
      JobTransitions.claim(current, {
        workerId: this.ctx.options.workerId,
        now,
        ...(preflight.ok ? { sandbox: decided } : { refusal: preflight.error }),
      }),
    );
    if (!claim.written) {
      this.log.info({ state: claim.current?.record.state }, "job is not waiting to run; dropping the work item");
      if (claim.current) await republishOutcome(this.topology, claim.current.record, this.log);
      return this.ack();
    }

    const record = claim.handle.record;
    this.events.attempt = record.attempt;
    this.log = this.log.child({ attempt: record.attempt });
    if (!preflight.ok || record.state !== "running") {
      this.log.info({ state: record.state, error: record.error }, "job ended before it started");
      return this.ack();
    }

    this.owned = new OwnedRecord(jobStore, claim.handle, this.ctx.options.workerId, record.attempt);
    const claimedAt = performance.now();
    // The attempt joins the job's trace: from the work item's header, else the record.
    const jobTrace = this.msg.headers?.get(TRACEPARENT) || record.traceparent;
    // Its wait in the queue, as a span from when it was queued (or due) to its claim now.
    const waited = Date.parse(record.runAt ?? record.queuedAt ?? record.createdAt);
    if (Number.isFinite(waited)) {
      startSpan("job.queued", jobTrace, {
        kind: SpanKind.INTERNAL,
        startTime: Math.min(waited, Date.now()),
        attributes: { "boxcar.job.id": this.jobId, "boxcar.attempt": record.attempt, "boxcar.pool": record.pool },
      }).span.end();
    }
    const attemptSpan = startSpan("job.attempt", jobTrace, {
      kind: SpanKind.CONSUMER,
      attributes: {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.destination.name": this.msg.subject,
        "messaging.message.id": this.jobId,
        "boxcar.job.id": this.jobId,
        "boxcar.agent": record.agent,
        "boxcar.attempt": record.attempt,
        "boxcar.sandbox.kind": preflight.runtime.kind,
        "boxcar.worker.id": this.ctx.options.workerId,
      },
    });
    try {
      this.endedAs = await this.runClaimed({
        owned: this.owned,
        runtime: preflight.runtime,
        secrets: preflight.secrets,
        sandbox: decided,
        claimedAt,
        traceparent: attemptSpan.traceparent,
      });
    } finally {
      const { endedAs } = this;
      attemptSpan.span.setAttribute("boxcar.job.state", endedAs ?? "unknown");
      if (endedAs !== "succeeded" && endedAs !== "requeue") {
        failSpan(attemptSpan.span, { message: `the attempt ended ${endedAs ?? "without an outcome"}` });
      }
      attemptSpan.span.end();
    }
  }

  /** Runs the claimed attempt to its end; resolves with how it ended (its final state, or `requeue`, `fenced`). */
  private async runClaimed(claim: Claim): Promise<string> {
    const { record } = claim.owned;
    this.ctx.metrics?.claimed(record.pool, record.queuedAt, record.startedAt);
    const removed = record.attempt > 1 && !this.session ? await removeEarlierAttempts(this.ctx, this.jobId, record.attempt, this.log) : 0;
    // The record says how the attempt taken over is known to be gone: its lease, or its sandbox removed too.
    if (removed > 0) await claim.owned.update(JobTransitions.takenOverSandboxRemoved);
    await this.session?.begin();
    this.log.info({ sandbox: claim.runtime.kind }, "job started");
    const attempt = new Attempt({
      worker: this.ctx,
      item: this.item,
      owned: claim.owned,
      sandbox: claim.sandbox,
      session: this.session,
      events: this.events,
      signals: this.signals,
      log: this.log,
      redactor: this.redactor,
      attemptLease: this.attemptLease,
      traceparent: claim.traceparent,
      room: this.room,
      signal: this.abort.signal,
      stopReason: () => this.stopReason,
      stop: (reason) => this.stop(reason),
    });
    const outcome = await attempt.run(claim.runtime, claim.secrets);
    this.finishing = true;
    const writer = new OutcomeWriter({
      topology: this.topology,
      workerId: this.ctx.options.workerId,
      metrics: this.ctx.metrics,
      item: this.item,
      owned: claim.owned,
      events: this.events,
      log: this.log,
      redactor: this.redactor,
      sandbox: claim.sandbox,
      inSession: this.session !== undefined,
      attemptLease: this.attemptLease,
      claimedAt: claim.claimedAt,
      room: this.room,
      stopReason: () => this.stopReason,
    });
    await this.settle(await writer.write(outcome));
    return outcome.kind === "final" ? outcome.state : outcome.kind;
  }

  /**
   * A job in a session: the session's sandbox, lent for this attempt (its lock held until the
   * attempt ends), or why the job cannot run in it; `busy` while a command or another job has it.
   */
  private async borrowSession(id: string): Promise<Preflight | "busy"> {
    const { agent } = this.item;
    try {
      checkAgentPolicy(agent, this.ctx.options.agentPolicy, "this worker's policy");
      if (!this.ctx.sessions) throw new BoxcarError(ErrorCode.sessionLost, `worker ${this.ctx.options.workerId} holds no sessions`);
      // The agent must be one this worker would run in such a sandbox (an untrusted one never on the host, say).
      const own = resolveRuntime(agent.runtime, agent.trusted, this.ctx.capabilities(), this.ctx.options.policy);
      const lease = await this.ctx.sessions.lend(
        id,
        { jobId: this.jobId, owner: ownerOf(this.item), agent, runtime: own },
        this.abort.signal,
      );
      this.session = lease;
      const stopped = () => {
        // Cancelled by the session's owner; else the session closed: its sandbox goes, and the job fails `session_lost`.
        if (lease.cancelled) this.stop("cancelled");
        else this.abort.abort();
      };
      lease.stopped.addEventListener("abort", stopped, { once: true });
      if (lease.stopped.aborted) stopped();
      // The session's secrets go to its own agent's jobs only: another agent's job gets none of them.
      const secrets = lease.agent === agent.name ? lease.secrets : new Map<string, string>();
      return { ok: true, runtime: { kind: lease.info.kind, reason: `the sandbox of session ${id}` }, secrets };
    } catch (err) {
      // Too many waiting, or this run was stopped while it waited: handed back.
      if ((err instanceof BoxcarError && err.code === ErrorCode.conflict) || this.stopReason) return "busy";
      return { ok: false, error: toErrorInfo(err), otherMayRun: false };
    }
  }

  /** Stops the attempt when its lease lapses: at its stop time, unless renewed by then (then looks again at the new one). */
  private watchLapse(): void {
    const lease = this.attemptLease;
    if (!lease) return;
    this.lapseTimer = setTimeout(
      () => {
        if (!lease.lapsed()) return this.watchLapse();
        this.log.warn(
          { leaseMs: lease.leaseMs, stopAfterMs: lease.stopAfterMs },
          "the job's lease was not confirmed in time; stopping its agent",
        );
        this.stop("lease_lost");
      },
      Math.max(0, lease.msLeft()),
    );
  }

  /** Keeps the message from being redelivered, and notices a cancel or takeover in the record. */
  private keepAlive(): void {
    // A lapsed attempt touches nothing: its work item may be another attempt's delivery by now.
    if (this.attemptLease?.lapsed()) return;
    const sentAt = performance.now();
    this.msg.working();
    this.topology.jobStore.read(this.jobId).then(
      (found) => {
        // Not claimed yet (or no longer there): the answer confirms the renewal all the same.
        if (!this.owned || !found) return this.attemptLease?.renewed(sentAt);
        const owned = this.owned.owns(found.record);
        // The read came back: NATS took the renewal too (sent before it, on the same connection).
        if (owned) this.attemptLease?.renewed(sentAt);
        if (this.finishing) return;
        if (!owned) this.stop("fenced");
        else if (found.record.cancelRequested) this.stop("cancelled");
      },
      (err: unknown) => this.log.warn({ err }, "could not read the job record"),
    );
  }

  /**
   * Hands the work item back (after `delayMs`). Not once the lease lapsed: JetStream settles a
   * message by its stream sequence, so a stale attempt's nak or ack would settle the delivery of
   * the attempt that took over.
   */
  private nak(delayMs?: number): void {
    if (this.attemptLease?.lapsed()) {
      this.log.warn({}, "the lease lapsed: leaving the work item to JetStream");
      return;
    }
    this.msg.nak(delayMs);
  }

  private async ack(): Promise<void> {
    if (this.attemptLease?.lapsed()) return this.log.warn({}, "the lease lapsed: leaving the work item to JetStream");
    try {
      this.msg.ack();
    } catch (err) {
      this.log.warn({ err }, "could not acknowledge the work item");
    }
  }

  /** Does with the work item what the outcome writer says. */
  private async settle(settlement: Settlement): Promise<void> {
    if (settlement.kind === "ack") await this.ack();
    else if (settlement.kind === "nak") this.nak(settlement.delayMs);
  }
}
