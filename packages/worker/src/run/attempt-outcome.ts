import { type AgentResultFile, type Artifact, ErrorCode, type ErrorInfo, type JobResult, type Usage } from "@boxcar/protocol";
import type { JobTransitions } from "@boxcar/protocol/internal";
import type { ExecResult } from "../sandbox/sandbox.js";

/**
 * Why a run was stopped before it ended on its own. `fenced`: another attempt owns the job;
 * `lease_lost`: this attempt's lease lapsed unconfirmed, so another may own it soon (lifeline.ts).
 */
export type StopReason = "cancelled" | "timed_out" | "deadline" | "worker_stopped" | "fenced" | "lease_lost";

/**
 * How an attempt ended, as its worker decides it from what happened, before anything is written:
 * the pure half of a run's ending (`Attempt` does the reading, `OutcomeWriter` the writing).
 */
export type Outcome =
  | {
      kind: "final";
      state: JobTransitions.AttemptState;
      result?: JobResult;
      artifacts: Artifact[];
      error?: ErrorInfo;
      /** The outcome event's summary. */
      message?: string;
      /** The agent said not to retry it (`"retry": false` in its result file). */
      noRetry?: boolean;
      /** The agent's provider refused it for its rate limit and asked it to wait this long (`rateLimited` in its result file). */
      retryAfterMs?: number;
      /** What its calls to its provider used, as it reported them (its usage file). */
      usage?: Usage;
    }
  /** The worker stops: the job goes back to the queue (what its calls used is in the usage sums, not its record). */
  | { kind: "requeue"; usage?: Usage }
  /** Another attempt owns the job now: this one must change nothing. */
  | { kind: "fenced" };

export type FinalOutcome = Outcome & { kind: "final" };

/** The longest pause an agent's report of its provider's rate limit may ask for, in seconds. */
const MAX_RETRY_AFTER_S = 3_600;

/** What the record keeps of how the agent's process ended. */
export function execResult(exec: ExecResult): Pick<JobResult, "exitCode" | "signal" | "durationMs" | "oomKilled" | "usage"> {
  return {
    exitCode: exec.exitCode,
    signal: exec.signal,
    durationMs: exec.durationMs,
    ...(exec.oomKilled !== undefined ? { oomKilled: exec.oomKilled } : {}),
    ...(exec.usage ? { usage: exec.usage } : {}),
  };
}

/**
 * An agent that ended on its own: killed for its memory, failed (its result file's `error`, a
 * signal, a non-zero exit code), or succeeded. `memoryLimit` is the sandbox's, for the message.
 */
export function outcomeOfExit(
  exec: ExecResult,
  file: AgentResultFile | undefined,
  artifacts: Artifact[],
  memoryLimit?: number,
): FinalOutcome {
  const result: JobResult = {
    ...execResult(exec),
    output: file?.output ?? null,
    ...(file?.summary !== undefined ? { summary: file.summary } : {}),
    ...(file?.handoff ? { handoff: file.handoff } : {}),
  };
  if (exec.breach !== undefined) {
    const message = exec.breach;
    return { kind: "final", state: "failed", result, artifacts, error: { code: ErrorCode.sandboxFailed, message }, message };
  }
  if (exec.oomKilled) {
    const message = `the agent used more memory than its limit${memoryLimit ? ` of ${memoryLimit} bytes` : ""} and was killed`;
    return { kind: "final", state: "failed", result, artifacts, error: { code: ErrorCode.oomKilled, message }, message };
  }
  // A report of its provider's rate limit fails the attempt whatever the exit code; its wait in
  // whole milliseconds (JetStream reads a redelivery's delay as whole nanoseconds).
  const limited = file?.rateLimited;
  const retryAfterMs = limited ? Math.ceil(Math.min(limited.retryAfter, MAX_RETRY_AFTER_S) * 1000) : undefined;
  const failure =
    file?.error !== undefined
      ? file.error
      : retryAfterMs !== undefined
        ? `the agent's provider refused it for its rate limit: retry after ${retryAfterMs / 1000} s`
        : exec.exitCode === null
          ? `agent was killed by ${exec.signal ?? "a signal"}`
          : exec.exitCode !== 0
            ? `agent exited with code ${exec.exitCode}`
            : undefined;
  if (failure !== undefined) {
    const error = { code: limited ? ErrorCode.rateLimited : ErrorCode.agentFailed, message: failure };
    return {
      kind: "final",
      state: "failed",
      result,
      artifacts,
      error,
      message: failure,
      ...(retryAfterMs !== undefined ? { retryAfterMs } : {}),
      ...(file?.retry === false ? { noRetry: true } : {}),
    };
  }
  return { kind: "final", state: "succeeded", result, artifacts, ...(file?.summary !== undefined ? { message: file.summary } : {}) };
}

/** A run stopped from outside, by the first reason given; without one, another attempt took over (or may have: its lease lapsed). */
export function outcomeOfStop(
  reason: StopReason | undefined,
  exec: ExecResult | undefined,
  job: { timeoutMs: number; deadlineAt?: string | undefined },
): Outcome {
  const result = exec && { ...execResult(exec), output: null };
  const final = (state: JobTransitions.AttemptState, code: ErrorCode, message: string): Outcome => ({
    kind: "final",
    state,
    artifacts: [],
    error: { code, message },
    message,
    ...(result ? { result } : {}),
  });
  switch (reason) {
    case "timed_out":
      return final("timed_out", ErrorCode.timedOut, `the agent ran longer than its time limit of ${job.timeoutMs} ms and was stopped`);
    case "deadline":
      return final("timed_out", ErrorCode.timedOut, `the job passed its deadline of ${job.deadlineAt} and was stopped`);
    case "cancelled":
      return final("cancelled", ErrorCode.cancelled, "cancelled while running");
    case "worker_stopped":
      return { kind: "requeue" };
    default:
      return { kind: "fenced" };
  }
}

/** An attempt that failed on an error (already redacted), with what its process did if it ran. */
export function failedOutcome(error: ErrorInfo, exec: ExecResult | undefined): FinalOutcome {
  return {
    kind: "final",
    state: "failed",
    artifacts: [],
    error,
    message: error.message,
    ...(exec ? { result: { ...execResult(exec), output: null } } : {}),
  };
}

/** `outcome` with the attempt's usage, when it reported some. */
export function withUsage(outcome: Outcome, usage: Usage | undefined): Outcome {
  return usage && outcome.kind !== "fenced" ? { ...outcome, usage } : outcome;
}
