import { ErrorCode, type ErrorInfo, type JobResult, type RetryOn, type RetryPolicy } from "@boxcar/protocol";

/** What happens to an attempt that ended failed or timed out. */
export type RetryPlan =
  | { kind: "retry"; delayMs: number }
  | { kind: "dead" }
  /** `note` says why a failure the policy covers is not retried. */
  | { kind: "final"; note?: string };

export interface EndedAttempt {
  state: "failed" | "timed_out";
  error?: ErrorInfo;
  result?: JobResult;
  /** The agent's result file said `retry: false`. */
  noRetry?: boolean;
  /** Its provider asked it to wait this long (the result file's `rateLimited`): no retry sooner. */
  retryAfterMs?: number;
}

/**
 * Which kind of failure an attempt had, for the policy's `on` list; undefined for failures that
 * retrying cannot fix (bad input, a bad result file, no sandbox, a missing secret or image).
 */
export function failureKind(attempt: EndedAttempt): RetryOn | undefined {
  if (attempt.state === "timed_out") return "timeout";
  switch (attempt.error?.code) {
    case ErrorCode.oomKilled:
      return "crash";
    case ErrorCode.agentFailed:
      return attempt.result?.exitCode === null && attempt.result.signal ? "crash" : "exit";
    case ErrorCode.rateLimited:
      return "exit";
    case ErrorCode.sandboxFailed:
      return "sandbox";
    default:
      return undefined;
  }
}

/**
 * Decides, from the job's retry policy, whether an ended attempt is retried (and after how
 * long), ends the job `dead` (attempts exhausted), or is simply final (no policy, a failure
 * that is never retried, or no time for another attempt before the job's deadline, `msLeft`).
 * `attemptsAllowed` is the record's budget; `random` is for jitter.
 */
export function planRetry(
  policy: RetryPolicy | undefined,
  ended: EndedAttempt,
  attempt: number,
  attemptsAllowed: number,
  msLeft: number = Number.POSITIVE_INFINITY,
  random: () => number = Math.random,
): RetryPlan {
  const kind = failureKind(ended);
  if (!policy || policy.maxAttempts <= 1 || ended.noRetry || kind === undefined || !policy.on.includes(kind)) return { kind: "final" };
  if (attempt >= attemptsAllowed) return { kind: "dead" };
  const base = policy.backoff === "fixed" ? policy.delay : policy.delay * 2 ** (attempt - 1);
  const capped = Math.min(base, policy.maxDelay);
  const delayMs = Math.max(Math.round(policy.jitter ? capped * (0.5 + random() * 0.5) : capped), ended.retryAfterMs ?? 0);
  if (delayMs >= msLeft) return { kind: "final", note: "not retried: the job's deadline comes before another attempt could start" };
  return { kind: "retry", delayMs };
}
