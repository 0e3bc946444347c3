import { describe, expect, test } from "vitest";
import { BoxcarError } from "./errors.js";
import type { JobRecord, JobState } from "./job.js";
import {
  buryUndelivered,
  cancel,
  claim,
  endAttempt,
  expire,
  finish,
  handBack,
  isOwnedBy,
  loseSession,
  refuse,
  release,
  requeueEnded,
  waitingDueAt,
} from "./job-transitions.js";

const NOW = "2026-11-24T12:00:00.000Z";
const at = (offsetMs: number) => new Date(Date.parse(NOW) + offsetMs).toISOString();

function job(state: JobState, extra: Partial<JobRecord> = {}): JobRecord {
  return {
    v: 1,
    id: "j1",
    agent: "a",
    pool: "default",
    state,
    attempt: state === "queued" || state === "accepted" ? 0 : 1,
    createdAt: at(-60_000),
    artifacts: [],
    history: [],
    ...extra,
  } as JobRecord;
}

const conflict = (f: () => unknown) => {
  try {
    f();
  } catch (err) {
    return err instanceof BoxcarError ? err.code : `not a BoxcarError: ${String(err)}`;
  }
  return "no error";
};

describe("cancel", () => {
  test("a waiting job ends cancelled; a running one is flagged for its worker", () => {
    for (const state of ["accepted", "queued"] as const) {
      expect(cancel(job(state), NOW)).toMatchObject({ state: "cancelled", finishedAt: NOW, error: { code: "cancelled" } });
    }
    expect(cancel(job("running"), NOW)).toMatchObject({ state: "running", cancelRequested: true });
  });

  test("cancelled already, or asked to: left as it is; finished: a conflict", () => {
    expect(cancel(job("cancelled"), NOW)).toBeNull();
    expect(cancel(job("running", { cancelRequested: true }), NOW)).toBeNull();
    for (const state of ["succeeded", "failed", "timed_out", "expired", "dead", "rejected"] as const) {
      expect(
        conflict(() => cancel(job(state), NOW)),
        state,
      ).toBe("conflict");
    }
  });
});

describe("expire", () => {
  test("past its queue timeout a first attempt expires; past its deadline any waiting attempt times out", () => {
    expect(expire(job("queued", { expiresAt: at(-1) }), NOW)).toMatchObject({ state: "expired", error: { code: "expired" } });
    expect(expire(job("queued", { attempt: 1, expiresAt: at(-1) }), NOW)).toBeNull(); // a retry: the queue timeout was for the first start
    expect(expire(job("queued", { attempt: 2, deadlineAt: at(-1) }), NOW)).toMatchObject({
      state: "timed_out",
      error: { code: "timed_out" },
    });
    expect(expire(job("queued", { expiresAt: at(-5), deadlineAt: at(-1) }), NOW)?.state).toBe("timed_out");
  });

  test("not due yet, or no longer waiting: left as it is", () => {
    expect(expire(job("queued", { expiresAt: at(1) }), NOW)).toBeNull();
    expect(expire(job("queued"), NOW)).toBeNull();
    expect(expire(job("running", { expiresAt: at(-1), deadlineAt: at(-1) }), NOW)).toBeNull();
    expect(waitingDueAt(job("queued", { expiresAt: at(5), deadlineAt: at(3) }))).toBe(Date.parse(at(3)));
    expect(waitingDueAt(job("succeeded", { deadlineAt: at(3) }))).toBeUndefined();
  });
});

describe("requeueEnded and buryUndelivered", () => {
  test("a dead job goes back to the queue with more attempts and its history; any other is a conflict", () => {
    const dead = job("dead", { attempt: 3, finishedAt: at(-5), history: [{ attempt: 3, state: "failed", finishedAt: at(-5) }] });
    expect(requeueEnded(dead, 2, NOW)).toMatchObject({ state: "queued", queuedAt: NOW, attemptsAllowed: 5, history: dead.history });
    expect(requeueEnded(dead, 2, NOW).finishedAt).toBeUndefined();
    expect(requeueEnded(job("failed"), 2, NOW)).toMatchObject({ state: "queued" });
    expect(requeueEnded({ ...job("cancelled"), cancelRequested: true }, 1, NOW).cancelRequested).toBeUndefined();
    expect(conflict(() => requeueEnded(job("succeeded"), 2, NOW))).toBe("conflict");
    expect(conflict(() => requeueEnded(job("expired"), 2, NOW))).toBe("conflict");
    expect(conflict(() => requeueEnded({ ...job("timed_out"), deadlineAt: "2000-01-01T00:00:00.000Z" }, 2, NOW))).toBe("conflict");
  });

  test("a running job JetStream gave up on ends dead, the attempt failed in its history", () => {
    const buried = buryUndelivered(job("running", { attempt: 2, workerId: "w1" }), 20, NOW);
    expect(buried).toMatchObject({ state: "dead", finishedAt: NOW, error: { code: "internal" } });
    expect(buried.error?.message).toContain("after 20 deliveries");
    expect(buried.history).toEqual([{ attempt: 2, state: "failed", finishedAt: NOW, error: buried.error, workerId: "w1" }]);
  });
});

describe("a worker's transitions", () => {
  const sandbox = { kind: "host" as const, id: "sbx-1", reason: "trusted agent" };

  test("a claim makes the next attempt the worker's, running in its sandbox, or failed with the refusal", () => {
    const running = claim(job("queued", { attempt: 1, error: { code: "internal", message: "before" } }), {
      workerId: "w1",
      now: NOW,
      sandbox,
    });
    expect(running).toMatchObject({ state: "running", attempt: 2, workerId: "w1", startedAt: NOW, sandbox });
    expect(running?.error).toBeUndefined();
    expect(isOwnedBy(running as JobRecord, "w1", 2)).toBe(true);
    expect(isOwnedBy(running as JobRecord, "w2", 2) || isOwnedBy(running as JobRecord, "w1", 1)).toBe(false);
    const refusal = { code: "no_sandbox", message: "no docker here" };
    expect(claim(job("queued"), { workerId: "w1", now: NOW, refusal })).toMatchObject({ state: "failed", attempt: 1, error: refusal });
  });

  test("a claim of a job still running (its worker died, froze or lost NATS) records the takeover; a queued one's does not", () => {
    const by = { workerId: "w2", now: NOW, sandbox: { kind: "host" as const, id: "sbx-2", reason: "trusted" } };
    const stale = job("running", { attempt: 1, workerId: "w1", sandbox: { kind: "host", id: "sbx-1", reason: "trusted" } });
    expect(claim(stale, by)).toMatchObject({
      attempt: 2,
      workerId: "w2",
      takeover: { attempt: 1, workerId: "w1", sandbox: "sbx-1", stopped: "lease" },
    });
    expect(claim(job("queued", { attempt: 1 }), by)?.takeover).toBeUndefined();
  });

  test("a claim ends instead a job cancelled meanwhile, past its deadline, or a first attempt past its queue timeout; a finished job is left alone", () => {
    const by = { workerId: "w1", now: NOW, sandbox };
    expect(claim(job("running", { cancelRequested: true }), by)?.state).toBe("cancelled");
    expect(claim(job("queued", { attempt: 1, deadlineAt: at(-1) }), by)?.state).toBe("timed_out");
    expect(claim(job("queued", { expiresAt: at(-1) }), by)?.state).toBe("expired");
    expect(claim(job("queued", { attempt: 1, expiresAt: at(-1) }), by)?.state).toBe("running");
    expect(claim(job("succeeded"), by)).toBeNull();
  });

  test("a hand-back queues the job again without using up an attempt; an outcome is written once, a retry keeps the history", () => {
    const running = job("running", { attempt: 1, workerId: "w1", sandbox, startedAt: at(-5), attemptsAllowed: 3 });
    expect(handBack(running, NOW)).toMatchObject({ state: "queued", queuedAt: NOW, attemptsAllowed: 4, attempt: 1 });
    expect(handBack(running, NOW).workerId).toBeUndefined();
    const error = { code: "agent_failed", message: "exit 1" };
    const end = { state: "failed" as const, now: NOW, sandbox, artifacts: [], error };
    expect(finish(running, end)).toMatchObject({ state: "failed", finishedAt: NOW, error, sandbox });
    const ended = { attempt: 1, state: "failed" as const, finishedAt: NOW, error, workerId: "w1" };
    const retry = endAttempt(running, ended, end, "retry");
    expect(retry).toMatchObject({ state: "queued", history: [ended], error, artifacts: [] });
    expect(retry.workerId).toBeUndefined();
    expect(endAttempt(running, ended, end, "dead")).toMatchObject({ state: "dead", finishedAt: NOW, history: [ended], sandbox });
  });
});

describe("delayed jobs and jobs in sessions", () => {
  test("release takes a waiting delayed job's runAt away once, and leaves other jobs alone", () => {
    const waiting = job("queued", { runAt: at(1_000) });
    const released = release(waiting);
    expect(released).not.toBeNull();
    expect(released?.runAt).toBeUndefined();
    expect(release(released as JobRecord)).toBeNull();
    expect(release(job("cancelled", { runAt: at(1_000) }))).toBeNull();
    expect(release(job("queued"))).toBeNull();
  });

  test("refuse ends a waiting job failed with the reason; a running or ended one is left", () => {
    const error = { code: "unknown_agent", message: "gone" };
    expect(refuse(job("queued"), error, NOW)).toMatchObject({ state: "failed", error, finishedAt: NOW });
    expect(refuse(job("running"), error, NOW)).toBeNull();
    expect(refuse(job("succeeded"), error, NOW)).toBeNull();
  });

  test("loseSession ends a waiting or running job of a session session_lost; an ended one is left", () => {
    const session = { id: "ses-a", workerId: "w1" };
    expect(loseSession(job("queued", { session }), "w1", NOW)).toMatchObject({ state: "failed", error: { code: "session_lost" } });
    expect(loseSession(job("running", { session }), "w1", NOW)?.error?.message).toContain("while the job ran");
    expect(loseSession(job("cancelled", { session }), "w1", NOW)).toBeNull();
  });
});
