import { signalFile } from "./api.js";
import { BoxcarError, ErrorCode, type ErrorInfo } from "./errors.js";
import type { JobEvent } from "./events.js";
import {
  type Artifact,
  type AttemptOutcome,
  isTerminal,
  type JobRecord,
  type JobResult,
  type JobState,
  limitNamed,
  MAX_KEPT_SIGNAL_BYTES,
  MAX_KEPT_SIGNALS,
  placesOf,
  type SandboxInfo,
} from "./job.js";
import { jobEvent } from "./job-event.js";
import { addUsage, NO_USAGE, type Usage } from "./usage.js";
import type { HandoffDecision } from "./workflow.js";

/**
 * Every transition of a job record, by a dispatcher or a worker, as a pure function of the
 * record as it stands: each returns the next record and the event that tells of it (a `JobStep`),
 * or null to leave it as it is, and throws a `conflict` when the request cannot apply to the
 * job's state. The job store (`JobStore.change`) runs them against the current record, runs them
 * again if another writer got there first, writes the record and publishes its event: no record
 * is written without its event, and no event tells of a record that was not written.
 *
 * States and who moves a job between them:
 *
 *   (admission, dispatcher) --> accepted | queued | rejected
 *   accepted/queued --claim (worker)--> running --finish (worker)--> succeeded | failed | timed_out | cancelled
 *   running --retry (worker)--> queued          running --bury (worker; max deliveries: dispatcher)--> dead
 *   running --hand back (worker)--> queued      dead, failed, timed_out, cancelled --requeueEnded (boxcar retry)--> queued
 *   accepted/queued --cancel--> cancelled       running --cancel--> running with cancelRequested
 *   accepted/queued --expire--> expired | timed_out
 *   accepted/queued/running, in a session whose worker is gone --loseSession (dispatcher)--> failed
 */

/**
 * A record to write and the event that tells of it; a change only the record shows (a kept
 * place, a postponed turn) has no event.
 */
export interface JobStep {
  record: JobRecord;
  event?: JobEvent;
}

/** The step to `record`, told by a `type` event (with `extra` beside what the record says). */
function told(record: JobRecord, type: JobEvent["type"], extra: Partial<JobEvent> = {}): JobStep {
  return { record, event: jobEvent(record, type, extra) };
}

/** The step to `record`, which no event tells of. */
const quiet = (record: JobRecord): JobStep => ({ record });

/** A job's first record, admitted (`queued`, the `accepted` before it folded in) or `rejected`. */
export function admit(record: JobRecord): JobStep {
  if (record.state === "rejected") return told(record, "rejected");
  // One stored message for both events (`accepted` folded into `queued`).
  const accepted = jobEvent({ ...record, state: "accepted" }, "accepted");
  const waits = record.concurrency?.waiting ? { message: `waits for a place under ${limitNamed(record.concurrency)}` } : {};
  return told(record, "queued", { folded: [accepted], ...waits });
}

/**
 * A cancel: a job not yet started ends `cancelled`; a running one is flagged (its worker stops
 * it). Already cancelled, or already asked to: left as it is. Finished: a conflict.
 */
export function cancel(job: JobRecord, now: string): JobStep | null {
  if (job.state === "cancelled" || (job.state === "running" && job.cancelRequested)) return null;
  if (isTerminal(job.state)) throw new BoxcarError(ErrorCode.conflict, `job ${job.id} already ended ${job.state}`);
  if (job.state === "running") return told({ ...job, cancelRequested: true }, "cancel_requested");
  return told(
    { ...job, state: "cancelled", finishedAt: now, error: { code: ErrorCode.cancelled, message: "cancelled before it started" } },
    "cancelled",
  );
}

/** When a waiting job runs out of time: its queue timeout (first attempt only) or its overall deadline. */
export function waitingDueAt(job: JobRecord): number | undefined {
  if (job.state !== "queued" && job.state !== "accepted") return undefined;
  const times = [job.attempt === 0 ? job.expiresAt : undefined, job.deadlineAt].flatMap((t) => (t ? [Date.parse(t)] : []));
  return times.length > 0 ? Math.min(...times) : undefined;
}

/**
 * A waiting job past its queue timeout ends `expired`, past its overall deadline (say, while it
 * waits for a retry) `timed_out`. One that started meanwhile, or is not due yet: left as it is.
 */
export function expire(job: JobRecord, now: string): JobStep | null {
  const due = waitingDueAt(job);
  const nowMs = Date.parse(now);
  if (due === undefined || due > nowMs) return null;
  const pastDeadline = job.deadlineAt !== undefined && Date.parse(job.deadlineAt) <= nowMs;
  const ended: JobRecord = {
    ...job,
    state: pastDeadline ? "timed_out" : "expired",
    finishedAt: now,
    error: pastDeadline
      ? { code: ErrorCode.timedOut, message: `passed its deadline of ${job.deadlineAt} while waiting for attempt ${job.attempt + 1}` }
      : {
          code: ErrorCode.expired,
          message: job.concurrency?.waiting
            ? `not started before ${job.expiresAt}: it waited for a place under ${limitNamed(job.concurrency)}`
            : `not started before ${job.expiresAt}: no worker of pool ${job.pool} took it in time`,
        },
  };
  return told(ended, pastDeadline ? "timed_out" : "expired");
}

/**
 * `boxcar retry`: an ended job (dead, failed, timed out or cancelled) goes back to the queue with
 * `maxAttempts` more attempts, its history kept, holding the places under its concurrency limits
 * it was given (`concurrency`); one past its deadline is refused (a re-run, a new job, is the
 * way), as a succeeded or expired one is.
 */
export function requeueEnded(job: JobRecord, maxAttempts: number, now: string, concurrency?: JobRecord["concurrency"]): JobStep {
  if (!RETRIABLE.has(job.state)) {
    throw new BoxcarError(
      ErrorCode.conflict,
      `job ${job.id} is ${job.state}: only a dead, failed, timed-out or cancelled job can be retried${job.state === "succeeded" || job.state === "expired" ? " (re-run it instead: jobs.rerun)" : ""}`,
    );
  }
  if (job.deadlineAt !== undefined && Date.parse(job.deadlineAt) <= Date.parse(now)) {
    throw new BoxcarError(ErrorCode.conflict, `job ${job.id} is past its deadline of ${job.deadlineAt}: re-run it instead (jobs.rerun)`);
  }
  // The attempt that ended it joins the history (a dead job's is there already).
  const last: AttemptOutcome | undefined =
    job.attempt > 0 && job.state !== "dead" && job.history.at(-1)?.attempt !== job.attempt
      ? {
          attempt: job.attempt,
          state: job.state as AttemptOutcome["state"],
          finishedAt: job.finishedAt ?? now,
          ...(job.workerId ? { workerId: job.workerId } : {}),
          ...(job.error ? { error: job.error } : {}),
        }
      : undefined;
  const requeued: JobRecord = {
    ...job,
    state: "queued",
    queuedAt: now,
    finishedAt: undefined,
    cancelRequested: undefined,
    attemptsAllowed: job.attempt + maxAttempts,
    history: last ? [...job.history, last] : job.history,
  };
  return told(concurrency ? { ...requeued, concurrency } : requeued, "retrying", { message: "retried by request" });
}

/** The ended states a job can be retried from (`jobs.retry`): it runs again, its history kept. */
const RETRIABLE: ReadonlySet<JobState> = new Set(["dead", "failed", "timed_out", "cancelled"]);

/**
 * A running job whose work item JetStream stopped delivering (`deliveries` times, all cut
 * short: its workers crashed, say) ends `dead`, its last attempt in the history as failed. One
 * not running (ended, or waiting: its deliveries went on backoffs and hand-backs) is left as it is.
 */
export function buryUndelivered(job: JobRecord, deliveries: number, now: string): JobStep | null {
  if (job.state !== "running") return null;
  const error: ErrorInfo = {
    code: ErrorCode.internal,
    message:
      `JetStream gave up after ${deliveries} deliveries of the work item: attempt ${job.attempt}` +
      `${job.workerId ? ` (worker ${job.workerId})` : ""} and those before it stopped without finishing, e.g. their workers crashed`,
  };
  const ended: AttemptOutcome = {
    attempt: Math.max(1, job.attempt),
    state: "failed",
    finishedAt: now,
    error,
    ...(job.workerId ? { workerId: job.workerId } : {}),
  };
  return told({ ...job, state: "dead", finishedAt: now, error, history: [...job.history, ended] }, "dead", { message: error.message });
}

/** What a worker knows when it claims a job: who it is, and the sandbox it chose, or why it cannot run the job. */
export interface Claim {
  workerId: string;
  now: string;
  /** The sandbox decided on; absent when `refusal` says why the job cannot run here. */
  sandbox?: SandboxInfo;
  refusal?: ErrorInfo;
}

/**
 * A worker claims a waiting job: the next attempt is its own, `running` in the sandbox it chose
 * (`started`), or `failed` at once with the refusal. A cancel asked for meanwhile, a deadline
 * passed or a first attempt past its queue timeout end the job instead, told by an event of the
 * state it ends in. A finished job is left as it is.
 */
export function claim(job: JobRecord, by: Claim): JobStep | null {
  const { now } = by;
  if (isTerminal(job.state)) return null;
  const endedBeforeStart = (ended: JobRecord): JobStep =>
    told(ended, ended.state as JobEvent["type"], ended.error ? { message: ended.error.message } : {});
  if (job.cancelRequested) {
    return endedBeforeStart({
      ...job,
      state: "cancelled",
      finishedAt: now,
      error: { code: ErrorCode.cancelled, message: "cancelled before it started" },
    });
  }
  if (job.deadlineAt && Date.parse(job.deadlineAt) <= Date.parse(now)) {
    const message = `passed its deadline of ${job.deadlineAt} before attempt ${job.attempt + 1} could start`;
    return endedBeforeStart({ ...job, state: "timed_out", finishedAt: now, error: { code: ErrorCode.timedOut, message } });
  }
  if (job.expiresAt && job.attempt === 0 && Date.parse(job.expiresAt) < Date.parse(now)) {
    const message = `not started before ${job.expiresAt}: it waited longer than its queue timeout`;
    return endedBeforeStart({ ...job, state: "expired", finishedAt: now, error: { code: ErrorCode.expired, message } });
  }
  // A running job is taken over: its attempt never ended, and was offered again only once its lease lapsed.
  const takeover: JobRecord["takeover"] =
    job.state === "running" && job.attempt > 0
      ? {
          attempt: job.attempt,
          ...(job.workerId ? { workerId: job.workerId } : {}),
          ...(job.sandbox ? { sandbox: job.sandbox.id } : {}),
          stopped: "lease",
        }
      : undefined;
  const claimed: JobRecord = {
    ...job,
    takeover,
    attempt: job.attempt + 1,
    workerId: by.workerId,
    startedAt: undefined,
    sandbox: undefined,
    result: undefined,
    error: undefined,
    finishedAt: undefined,
    artifacts: [],
  };
  if (by.refusal) return endedBeforeStart({ ...claimed, state: "failed", finishedAt: now, error: by.refusal });
  const tookOver = takeover
    ? `takes over attempt ${takeover.attempt}${takeover.workerId ? ` of worker ${takeover.workerId}` : ""}, whose lease lapsed`
    : undefined;
  return told({ ...claimed, state: "running", startedAt: now, sandbox: by.sandbox }, "started", {
    ...(by.sandbox ? { sandbox: by.sandbox } : {}),
    ...(tookOver ? { message: tookOver } : {}),
  });
}

/**
 * The attempt a claim took over is known to be gone by more than its lapsed lease: its sandbox
 * was found and removed. Only the record says so.
 */
export function takenOverSandboxRemoved(job: JobRecord): JobStep | null {
  if (!job.takeover) return null;
  return quiet({ ...job, takeover: { ...job.takeover, stopped: "removed" } });
}

/** True while `job` is `attempt` of `workerId`: only then may that worker write its outcome. */
export function isOwnedBy(job: JobRecord, workerId: string, attempt: number): boolean {
  return job.state === "running" && job.workerId === workerId && job.attempt === attempt;
}

/** A running job handed back by its worker (a drain past its grace): queued again, without using up an attempt. */
export function handBack(job: JobRecord, now: string): JobStep {
  const error = { code: ErrorCode.workerStopped, message: "the worker stopped while the job ran; it goes back to the queue" };
  const requeued: JobRecord = {
    ...job,
    state: "queued",
    queuedAt: now,
    workerId: undefined,
    sandbox: undefined,
    startedAt: undefined,
    attemptsAllowed: (job.attemptsAllowed ?? 1) + 1,
  };
  return told(requeued, "requeued", { error, message: error.message });
}

/** The states an attempt's worker can end a job in. */
export type AttemptState = "succeeded" | "failed" | "timed_out" | "cancelled";

/** How an attempt ended, as its worker writes it. */
export interface AttemptEnd {
  state: AttemptState;
  now: string;
  sandbox?: SandboxInfo;
  result?: JobResult;
  artifacts: Artifact[];
  error?: ErrorInfo;
  /** The agent reported its provider's rate limit: until when (ISO 8601) its key should pause. */
  providerLimitedUntil?: string;
  /** What the attempt's calls to its provider used, as its agent reported them. */
  usage?: Usage;
  /** What the event of its end says of it. */
  message?: string;
}

/** The job's final outcome, from the attempt that ran it. */
export function finish(job: JobRecord, end: AttemptEnd): JobStep {
  const finished: JobRecord = {
    ...job,
    state: end.state,
    finishedAt: end.now,
    sandbox: end.sandbox,
    result: end.result,
    artifacts: end.artifacts,
    error: end.error,
    ...providerLimit(end, job),
  };
  return told(finished, end.state, {
    ...(end.sandbox ? { sandbox: end.sandbox } : {}),
    ...(end.message !== undefined ? { message: end.message } : {}),
  });
}

/**
 * What an attempt's end reports besides its outcome: its `providerLimitedUntil` (or none: an
 * earlier attempt's goes), and its usage, added to the job's.
 */
function providerLimit(end: AttemptEnd, job: JobRecord): Pick<JobRecord, "providerLimitedUntil" | "usage"> {
  return {
    providerLimitedUntil: end.providerLimitedUntil,
    ...(end.usage ? { usage: addUsage(job.usage ?? NO_USAGE, end.usage) } : {}),
  };
}

/**
 * A failed attempt its retry policy covers: into the history, then back to the queue after
 * `delayMs` (`retry`), or, attempts exhausted, `dead` with the attempt's artifacts.
 */
export function endAttempt(
  job: JobRecord,
  ended: AttemptOutcome,
  end: AttemptEnd,
  then: { kind: "retry"; delayMs: number } | { kind: "dead" },
): JobStep {
  const kept = { ...job, history: [...job.history, ended], result: end.result, error: end.error, ...providerLimit(end, job) };
  const { attempt } = ended;
  const allowed = job.attemptsAllowed ?? attempt;
  const why = end.error?.message ?? ended.state;
  if (then.kind === "retry") {
    const message = `attempt ${attempt} of ${allowed} ${ended.state === "timed_out" ? "timed out" : "failed"} (${why}); retrying in ${then.delayMs} ms`;
    const requeued: JobRecord = {
      ...kept,
      state: "queued",
      queuedAt: end.now,
      workerId: undefined,
      sandbox: undefined,
      startedAt: undefined,
      artifacts: [],
    };
    return told(requeued, "retrying", { message });
  }
  // Attempts taken over (their worker died, froze or lost NATS) left no outcome in the history.
  const failed = kept.history.filter((h) => h.state === "failed" || h.state === "timed_out").length;
  const cutShort = Math.max(0, attempt - failed);
  const message =
    cutShort > 0
      ? `all ${attempt} attempts ended without success: ${failed} failed, ${cutShort} cut short (their worker died, froze or lost NATS); the last: ${why}`
      : `all ${allowed} attempts failed; the last: ${why}`;
  return told({ ...kept, state: "dead", finishedAt: end.now, artifacts: end.artifacts, sandbox: end.sandbox }, "dead", { message });
}

/**
 * A job in a session whose worker (`workerId`) is gone (docs/sessions.md#jobs-in-a-session):
 * nothing else can run it, so it ends `failed` with `session_lost`, waiting or running. A
 * finished job, or one not in a session of that worker, is left as it is.
 */
export function loseSession(job: JobRecord, workerId: string, now: string): JobStep | null {
  if (isTerminal(job.state) || job.session?.workerId !== workerId) return null;
  const error: ErrorInfo = {
    code: ErrorCode.sessionLost,
    message: `session ${job.session?.id ?? job.spec?.session} is lost: its worker ${workerId} is gone${job.state === "running" ? " while the job ran" : ""}`,
  };
  return told({ ...job, state: "failed", finishedAt: now, error }, "failed", { message: error.message });
}

/**
 * A delayed job whose time has come: its work item is about to be published, so its record no
 * longer waits (`runAt` goes), and it is `released` to its pool (or, given `concurrency` that
 * waits, once it is given a place). Null when it was released already (a marker delivered
 * again) or has ended.
 */
export function release(job: JobRecord, concurrency?: JobRecord["concurrency"]): JobStep | null {
  if (job.runAt === undefined || isTerminal(job.state) || job.attempt > 0) return null;
  const { runAt: _released, ...rest } = job;
  const released = concurrency ? { ...rest, concurrency } : rest;
  return released.concurrency?.waiting ? quiet(released) : told(released, "released", { message: "its time came" });
}

/**
 * A job that waited for a place under a concurrency limit and was given its last: its work item
 * is about to be published, and it is `released`. Null when it has one already (its marker
 * handled twice) or ended.
 */
export function givePlace(job: JobRecord): JobStep | null {
  if (!job.concurrency?.waiting || isTerminal(job.state)) return null;
  const { waiting: _given, ...held } = job.concurrency;
  const message =
    placesOf(held).length > 1 ? "given a place under each of its concurrency limits" : `given a place under ${limitNamed(held)}`;
  return told({ ...job, concurrency: held }, "released", { message });
}

/**
 * A signal to a job that has not started: kept in its record for its worker to write before its
 * agent starts (the event names the file it will be). Null once it started or ended; a
 * `conflict` past 16 signals or 64 KiB of payload.
 */
export function keepSignal(job: JobRecord, signal: NonNullable<JobRecord["signals"]>[number]): JobStep | null {
  if (job.state !== "queued") return null;
  const signals = [...(job.signals ?? []), signal];
  const bytes = signals.reduce((sum, s) => sum + Buffer.byteLength(JSON.stringify(s.payload)), 0);
  if (signals.length > MAX_KEPT_SIGNALS || bytes > MAX_KEPT_SIGNAL_BYTES) {
    throw new BoxcarError(
      ErrorCode.conflict,
      `job ${job.id} has not started and keeps at most ${MAX_KEPT_SIGNALS} signals, ${MAX_KEPT_SIGNAL_BYTES / 1024} KiB of payload in all, until it does: send again once it runs`,
    );
  }
  const file = signalFile(signals.length, signal.name);
  return told({ ...job, signals }, "signal", { message: `signal ${signal.name} kept until it starts (${file})` });
}

/**
 * A job given its place under one limit (`from`) that finds none free under the next of its
 * places (`next`): it waits there. Null when it no longer waits at `from` (it ended, or a
 * dispatcher moved it on already).
 */
export function waitFor(job: JobRecord, from: string, next: string): JobStep | null {
  if (!job.concurrency?.waiting || job.concurrency.place !== from || isTerminal(job.state)) return null;
  return quiet({ ...job, concurrency: { ...job.concurrency, place: next } });
}

/**
 * A delayed job whose time came, put back to the turn its agent's rate limit gave it (`at`, ms
 * since the epoch): its queue timeout moves with it. Null when it started or ended meanwhile.
 */
export function postpone(job: JobRecord, at: number): JobStep | null {
  if (job.runAt === undefined || isTerminal(job.state) || job.attempt > 0) return null;
  const by = at - Date.parse(job.runAt);
  const expiresAt = job.expiresAt === undefined ? undefined : new Date(Date.parse(job.expiresAt) + by).toISOString();
  return quiet({ ...job, runAt: new Date(at).toISOString(), rateLimited: true, ...(expiresAt ? { expiresAt } : {}) });
}

/** A waiting job that can never start (its agent is gone, say): it ends `failed` with `error`. */
export function refuse(job: JobRecord, error: ErrorInfo, now: string): JobStep | null {
  if (isTerminal(job.state) || job.state === "running") return null;
  return told({ ...job, state: "failed", finishedAt: now, error }, "failed", { message: error.message });
}

/**
 * What the dispatcher made of a job's handoff request: the next job (`handoff`) or a refusal
 * (`handoff_refused`). Once: a job whose handoff is decided keeps that decision (null).
 */
export function decideHandoff(job: JobRecord, decision: HandoffDecision): JobStep | null {
  if (job.handoff) return null;
  const decided = { ...job, handoff: decision };
  return decision.jobId
    ? told(decided, "handoff", { to: decision.to, next: decision.jobId, message: `handed off to ${decision.to} (job ${decision.jobId})` })
    : told(decided, "handoff_refused", {
        to: decision.to,
        ...(decision.error ? { error: decision.error, message: decision.error.message } : {}),
      });
}
