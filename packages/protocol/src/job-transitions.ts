import { BoxcarError, ErrorCode, type ErrorInfo } from "./errors.js";
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
  type SandboxInfo,
} from "./job.js";
import { addUsage, NO_USAGE, type Usage } from "./usage.js";

/**
 * Every transition of a job record, by a dispatcher or a worker, as a pure function of the
 * record as it stands: each returns the next record, or null to leave it as it is, and throws a
 * `conflict` when the request cannot apply to the job's state. The job store (`JobStore.change`) runs them against
 * the current record and runs them again if another writer got there first.
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
 * A cancel: a job not yet started ends `cancelled`; a running one is flagged (its worker stops
 * it). Already cancelled, or already asked to: left as it is. Finished: a conflict.
 */
export function cancel(job: JobRecord, now: string): JobRecord | null {
  if (job.state === "cancelled" || (job.state === "running" && job.cancelRequested)) return null;
  if (isTerminal(job.state)) throw new BoxcarError(ErrorCode.conflict, `job ${job.id} already ended ${job.state}`);
  if (job.state === "running") return { ...job, cancelRequested: true };
  return { ...job, state: "cancelled", finishedAt: now, error: { code: ErrorCode.cancelled, message: "cancelled before it started" } };
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
export function expire(job: JobRecord, now: string): JobRecord | null {
  const due = waitingDueAt(job);
  const nowMs = Date.parse(now);
  if (due === undefined || due > nowMs) return null;
  const pastDeadline = job.deadlineAt !== undefined && Date.parse(job.deadlineAt) <= nowMs;
  return {
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
}

/**
 * `boxcar retry`: an ended job (dead, failed, timed out or cancelled) goes back to the queue with
 * `maxAttempts` more attempts, its history kept; one past its deadline is refused (a re-run, a new
 * job, is the way), as a succeeded or expired one is.
 */
export function requeueEnded(job: JobRecord, maxAttempts: number, now: string): JobRecord {
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
  return {
    ...job,
    state: "queued",
    queuedAt: now,
    finishedAt: undefined,
    cancelRequested: undefined,
    attemptsAllowed: job.attempt + maxAttempts,
    history: last ? [...job.history, last] : job.history,
  };
}

/** The ended states a job can be retried from (`jobs.retry`): it runs again, its history kept. */
const RETRIABLE: ReadonlySet<JobState> = new Set(["dead", "failed", "timed_out", "cancelled"]);

/**
 * A running job whose work item JetStream stopped delivering (`deliveries` times, all cut
 * short: its workers crashed, say) ends `dead`, its last attempt in the history as failed.
 */
export function buryUndelivered(job: JobRecord, deliveries: number, now: string): JobRecord {
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
  return { ...job, state: "dead", finishedAt: now, error, history: [...job.history, ended] };
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
 * (or `failed` at once with the refusal). A cancel asked for meanwhile, a deadline passed or a
 * first attempt past its queue timeout end the job instead. A finished job is left as it is.
 */
export function claim(job: JobRecord, by: Claim): JobRecord | null {
  const { now } = by;
  if (isTerminal(job.state)) return null;
  if (job.cancelRequested) {
    return { ...job, state: "cancelled", finishedAt: now, error: { code: ErrorCode.cancelled, message: "cancelled before it started" } };
  }
  if (job.deadlineAt && Date.parse(job.deadlineAt) <= Date.parse(now)) {
    const message = `passed its deadline of ${job.deadlineAt} before attempt ${job.attempt + 1} could start`;
    return { ...job, state: "timed_out", finishedAt: now, error: { code: ErrorCode.timedOut, message } };
  }
  if (job.expiresAt && job.attempt === 0 && Date.parse(job.expiresAt) < Date.parse(now)) {
    const message = `not started before ${job.expiresAt}: it waited longer than its queue timeout`;
    return { ...job, state: "expired", finishedAt: now, error: { code: ErrorCode.expired, message } };
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
  return by.refusal
    ? { ...claimed, state: "failed", finishedAt: now, error: by.refusal }
    : { ...claimed, state: "running", startedAt: now, sandbox: by.sandbox };
}

/** True while `job` is `attempt` of `workerId`: only then may that worker write its outcome. */
export function isOwnedBy(job: JobRecord, workerId: string, attempt: number): boolean {
  return job.state === "running" && job.workerId === workerId && job.attempt === attempt;
}

/** A running job handed back by its worker (a drain past its grace): queued again, without using up an attempt. */
export function handBack(job: JobRecord, now: string): JobRecord {
  return {
    ...job,
    state: "queued",
    queuedAt: now,
    workerId: undefined,
    sandbox: undefined,
    startedAt: undefined,
    attemptsAllowed: (job.attemptsAllowed ?? 1) + 1,
  };
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
}

/** The job's final outcome, from the attempt that ran it. */
export function finish(job: JobRecord, end: AttemptEnd): JobRecord {
  return {
    ...job,
    state: end.state,
    finishedAt: end.now,
    sandbox: end.sandbox,
    result: end.result,
    artifacts: end.artifacts,
    error: end.error,
    ...providerLimit(end, job),
  };
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
 * A failed attempt its retry policy covers: into the history, then back to the queue
 * (`retry`), or, attempts exhausted, `dead` with the attempt's artifacts.
 */
export function endAttempt(job: JobRecord, ended: AttemptOutcome, end: AttemptEnd, then: "retry" | "dead"): JobRecord {
  const kept = { ...job, history: [...job.history, ended], result: end.result, error: end.error, ...providerLimit(end, job) };
  return then === "retry"
    ? { ...kept, state: "queued", queuedAt: end.now, workerId: undefined, sandbox: undefined, startedAt: undefined, artifacts: [] }
    : { ...kept, state: "dead", finishedAt: end.now, artifacts: end.artifacts, sandbox: end.sandbox };
}

/**
 * A job in a session whose worker is gone (docs/sessions.md#jobs-in-a-session): nothing else can
 * run it, so it ends `failed` with `session_lost`, waiting or running. A finished job is left as
 * it is.
 */
export function loseSession(job: JobRecord, workerId: string, now: string): JobRecord | null {
  if (isTerminal(job.state)) return null;
  const error: ErrorInfo = {
    code: ErrorCode.sessionLost,
    message: `session ${job.session?.id ?? job.spec?.session} is lost: its worker ${workerId} is gone${job.state === "running" ? " while the job ran" : ""}`,
  };
  return { ...job, state: "failed", finishedAt: now, error };
}

/**
 * A delayed job whose time has come: its work item is about to be published, so its record no
 * longer waits (`runAt` goes). Null when it was released already (a marker delivered again) or
 * has ended.
 */
export function release(job: JobRecord, concurrency?: JobRecord["concurrency"]): JobRecord | null {
  if (job.runAt === undefined || isTerminal(job.state) || job.attempt > 0) return null;
  const { runAt: _released, ...rest } = job;
  return concurrency ? { ...rest, concurrency } : rest;
}

/**
 * A job that waited for a place under a concurrency limit and was given its last: its work item
 * is about to be published. Null when it has one already (its marker handled twice) or ended.
 */
export function givePlace(job: JobRecord): JobRecord | null {
  if (!job.concurrency?.waiting || isTerminal(job.state)) return null;
  const { waiting: _given, ...held } = job.concurrency;
  return { ...job, concurrency: held };
}

/**
 * A signal to a job that has not started: kept in its record for its worker to write before its
 * agent starts. Null once it started or ended; a `conflict` past 16 signals or 64 KiB of payload.
 */
export function keepSignal(job: JobRecord, signal: NonNullable<JobRecord["signals"]>[number]): JobRecord | null {
  if (job.state !== "queued") return null;
  const signals = [...(job.signals ?? []), signal];
  const bytes = signals.reduce((sum, s) => sum + Buffer.byteLength(JSON.stringify(s.payload)), 0);
  if (signals.length > MAX_KEPT_SIGNALS || bytes > MAX_KEPT_SIGNAL_BYTES) {
    throw new BoxcarError(
      ErrorCode.conflict,
      `job ${job.id} has not started and keeps at most ${MAX_KEPT_SIGNALS} signals, ${MAX_KEPT_SIGNAL_BYTES / 1024} KiB of payload in all, until it does: send again once it runs`,
    );
  }
  return { ...job, signals };
}

/**
 * A job given its place under one limit (`from`) that finds none free under the next of its
 * places (`next`): it waits there. Null when it no longer waits at `from` (it ended, or a
 * dispatcher moved it on already).
 */
export function waitFor(job: JobRecord, from: string, next: string): JobRecord | null {
  if (!job.concurrency?.waiting || job.concurrency.place !== from || isTerminal(job.state)) return null;
  return { ...job, concurrency: { ...job.concurrency, place: next } };
}

/**
 * A delayed job whose time came, put back to the turn its agent's rate limit gave it (`at`, ms
 * since the epoch): its queue timeout moves with it. Null when it started or ended meanwhile.
 */
export function postpone(job: JobRecord, at: number): JobRecord | null {
  if (job.runAt === undefined || isTerminal(job.state) || job.attempt > 0) return null;
  const by = at - Date.parse(job.runAt);
  const expiresAt = job.expiresAt === undefined ? undefined : new Date(Date.parse(job.expiresAt) + by).toISOString();
  return { ...job, runAt: new Date(at).toISOString(), rateLimited: true, ...(expiresAt ? { expiresAt } : {}) };
}

/** A waiting job that can never start (its agent is gone, say): it ends `failed` with `error`. */
export function refuse(job: JobRecord, error: ErrorInfo, now: string): JobRecord | null {
  if (isTerminal(job.state) || job.state === "running") return null;
  return { ...job, state: "failed", finishedAt: now, error };
}
