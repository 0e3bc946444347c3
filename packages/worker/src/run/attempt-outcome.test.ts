import { ErrorCode } from "@boxcar/protocol";
import { describe, expect, test } from "vitest";
import type { ExecResult } from "../sandbox/sandbox.js";
import { failedOutcome, outcomeOfExit, outcomeOfStop } from "./attempt-outcome.js";

const exit = (exitCode: number | null, extra: Partial<ExecResult> = {}): ExecResult => ({
  exitCode,
  signal: exitCode === null ? "SIGKILL" : null,
  aborted: false,
  durationMs: 12,
  ...extra,
});
const artifact = { path: "out/a.txt", object: "j/out/a.txt", size: 1, sha256: "0".repeat(64) };

describe("outcomeOfExit", () => {
  test("exit 0 succeeds with the result file's output and summary, and the artifacts", () => {
    const outcome = outcomeOfExit(exit(0), { output: { n: 1 }, summary: "done" }, [artifact]);
    expect(outcome).toEqual({
      kind: "final",
      state: "succeeded",
      result: { exitCode: 0, signal: null, durationMs: 12, output: { n: 1 }, summary: "done" },
      artifacts: [artifact],
      message: "done",
    });
  });

  test("no result file: output null", () => {
    expect(outcomeOfExit(exit(0), undefined, [])).toMatchObject({ state: "succeeded", result: { output: null } });
  });

  test("a non-zero exit, a signal, and the result file's error each fail the attempt, saying which", () => {
    expect(outcomeOfExit(exit(3), undefined, [])).toMatchObject({
      state: "failed",
      error: { code: ErrorCode.agentFailed, message: "agent exited with code 3" },
    });
    expect(outcomeOfExit(exit(null), undefined, [])).toMatchObject({ state: "failed", message: "agent was killed by SIGKILL" });
    // The agent's own error wins over its exit code, and it may ask not to be retried.
    expect(outcomeOfExit(exit(0), { output: null, error: "quota exceeded", retry: false }, [])).toMatchObject({
      state: "failed",
      error: { code: ErrorCode.agentFailed, message: "quota exceeded" },
      noRetry: true,
    });
  });

  test("a report of its provider's rate limit fails the attempt rate_limited, whatever the exit code, with the wait (at most an hour)", () => {
    expect(outcomeOfExit(exit(0), { rateLimited: { retryAfter: 30 } }, [])).toMatchObject({
      state: "failed",
      error: { code: ErrorCode.rateLimited, message: "the agent's provider refused it for its rate limit: retry after 30 s" },
      retryAfterMs: 30_000,
    });
    expect(outcomeOfExit(exit(1), { rateLimited: { retryAfter: 86_400 }, error: "429 from the model" }, [])).toMatchObject({
      error: { code: ErrorCode.rateLimited, message: "429 from the model" },
      retryAfterMs: 3_600_000,
    });
  });

  test("killed for its memory: oom_killed, naming the limit", () => {
    expect(outcomeOfExit(exit(137, { oomKilled: true }), undefined, [], 64 * 1024 ** 2)).toMatchObject({
      state: "failed",
      result: { oomKilled: true },
      error: { code: ErrorCode.oomKilled, message: "the agent used more memory than its limit of 67108864 bytes and was killed" },
    });
  });
});

describe("outcomeOfStop", () => {
  const job = { timeoutMs: 1_000, deadlineAt: "2026-01-01T00:00:00.000Z" };

  test("a timeout or a deadline ends timed_out, a cancel cancelled, keeping how the process ended", () => {
    expect(outcomeOfStop("timed_out", exit(null), job)).toMatchObject({
      state: "timed_out",
      error: { code: ErrorCode.timedOut, message: "the agent ran longer than its time limit of 1000 ms and was stopped" },
      result: { exitCode: null, signal: "SIGKILL", output: null },
    });
    expect(outcomeOfStop("deadline", undefined, job)).toMatchObject({
      state: "timed_out",
      error: { message: "the job passed its deadline of 2026-01-01T00:00:00.000Z and was stopped" },
    });
    expect(outcomeOfStop("cancelled", undefined, job)).toEqual({
      kind: "final",
      state: "cancelled",
      artifacts: [],
      error: { code: ErrorCode.cancelled, message: "cancelled while running" },
      message: "cancelled while running",
    });
  });

  test("a stopping worker hands the job back; a fenced attempt (or no reason) changes nothing", () => {
    expect(outcomeOfStop("worker_stopped", exit(null), job)).toEqual({ kind: "requeue" });
    expect(outcomeOfStop("fenced", undefined, job)).toEqual({ kind: "fenced" });
    expect(outcomeOfStop(undefined, undefined, job)).toEqual({ kind: "fenced" });
  });
});

test("failedOutcome keeps the error and what the process did", () => {
  const error = { code: ErrorCode.sandboxFailed, message: "no room" };
  expect(failedOutcome(error, undefined)).toEqual({ kind: "final", state: "failed", artifacts: [], error, message: "no room" });
  expect(failedOutcome(error, exit(1))).toMatchObject({ result: { exitCode: 1, output: null } });
});
