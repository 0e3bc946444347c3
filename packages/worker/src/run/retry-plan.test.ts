import { RetryPolicy } from "@boxcar/protocol";
import { describe, expect, test } from "vitest";
import { type EndedAttempt, planRetry } from "./retry-plan.js";

const policy = (p: Parameters<typeof RetryPolicy.parse>[0]) => RetryPolicy.parse(p);
const exit: EndedAttempt = {
  state: "failed",
  error: { code: "agent_failed", message: "agent exited with code 3" },
  result: { exitCode: 3, signal: null, output: null, durationMs: 1 },
};

describe("planRetry", () => {
  test("exponential backoff, capped, without jitter", () => {
    const p = policy({ maxAttempts: 10, delay: "1s", maxDelay: "5s", jitter: false });
    expect([1, 2, 3, 4].map((a) => planRetry(p, exit, a, 10))).toEqual([
      { kind: "retry", delayMs: 1000 },
      { kind: "retry", delayMs: 2000 },
      { kind: "retry", delayMs: 4000 },
      { kind: "retry", delayMs: 5000 },
    ]);
  });

  test("fixed backoff with jitter stays between half and all of the delay", () => {
    const p = policy({ maxAttempts: 3, backoff: "fixed", delay: "2s" });
    expect(planRetry(p, exit, 1, 3, Number.POSITIVE_INFINITY, () => 0)).toEqual({ kind: "retry", delayMs: 1000 });
    expect(planRetry(p, exit, 2, 3, Number.POSITIVE_INFINITY, () => 1)).toEqual({ kind: "retry", delayMs: 2000 });
  });

  test("an attempt its provider refused for its rate limit is retried no sooner than it asked", () => {
    const p = policy({ maxAttempts: 3, delay: "1s", jitter: false });
    const limited: EndedAttempt = { state: "failed", error: { code: "rate_limited", message: "429" }, retryAfterMs: 30_000 };
    expect(planRetry(p, limited, 1, 3)).toEqual({ kind: "retry", delayMs: 30_000 });
    expect(planRetry(p, { ...limited, retryAfterMs: 10 }, 1, 3)).toEqual({ kind: "retry", delayMs: 1_000 });
    expect(planRetry(p, limited, 1, 3, 20_000).kind).toBe("final");
    expect(planRetry(policy({ maxAttempts: 3, on: ["timeout"] }), limited, 1, 3).kind).toBe("final");
  });

  test("no retry when the job's deadline comes before the next attempt would start", () => {
    const p = policy({ maxAttempts: 5, delay: "2s", jitter: false });
    expect(planRetry(p, exit, 1, 5, 2_500)).toEqual({ kind: "retry", delayMs: 2000 });
    expect(planRetry(p, exit, 1, 5, 1_500)).toEqual({
      kind: "final",
      note: "not retried: the job's deadline comes before another attempt could start",
    });
  });

  test("the last allowed attempt ends the job dead; no policy or one attempt means plainly final", () => {
    expect(planRetry(policy({ maxAttempts: 3 }), exit, 3, 3)).toEqual({ kind: "dead" });
    expect(planRetry(undefined, exit, 1, 1)).toEqual({ kind: "final" });
    expect(planRetry(policy({ maxAttempts: 1 }), exit, 1, 1)).toEqual({ kind: "final" });
  });

  test("only the failures the policy names are retried; some never are", () => {
    const onlyTimeouts = policy({ maxAttempts: 3, on: ["timeout"] });
    expect(planRetry(onlyTimeouts, exit, 1, 3).kind).toBe("final");
    expect(planRetry(onlyTimeouts, { state: "timed_out" }, 1, 3).kind).toBe("retry");
    const all = policy({ maxAttempts: 3 });
    expect(planRetry(all, { ...exit, noRetry: true }, 1, 3).kind).toBe("final");
    for (const code of ["bad_result", "missing_secret", "no_sandbox", "image_unavailable", "invalid"]) {
      expect(planRetry(all, { state: "failed", error: { code, message: "x" } }, 1, 3).kind).toBe("final");
    }
    expect(planRetry(all, { state: "failed", error: { code: "oom_killed", message: "x" } }, 1, 3).kind).toBe("retry");
  });
});
