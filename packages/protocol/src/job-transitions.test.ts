import { describe, expect, test } from "vitest";
import { BoxcarError } from "./errors.js";
import type { JobRecord, JobState } from "./job.js";
import {
  admit,
  buryUndelivered,
  cancel,
  claim,
  decideHandoff,
  endAttempt,
  expire,
  finish,
  givePlace,
  handBack,
  isOwnedBy,
  type JobStep,
  keepSignal,
  loseSession,
  postpone,
  refuse,
  release,
  requeueEnded,
  takenOverSandboxRemoved,
  waitFor,
  waitingDueAt,
} from "./job-transitions.js";

/** The record a step writes (null: none). */
const rec = (step: JobStep | null) => step?.record ?? null;

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
      expect(rec(cancel(job(state), NOW))).toMatchObject({ state: "cancelled", finishedAt: NOW, error: { code: "cancelled" } });
    }
    expect(rec(cancel(job("running"), NOW))).toMatchObject({ state: "running", cancelRequested: true });
  });

  test("cancelled already, or asked to: left as it is; finished: a conflict", () => {
    expect(rec(cancel(job("cancelled"), NOW))).toBeNull();
    expect(rec(cancel(job("running", { cancelRequested: true }), NOW))).toBeNull();
    for (const state of ["succeeded", "failed", "timed_out", "expired", "dead", "rejected"] as const) {
      expect(
        conflict(() => rec(cancel(job(state), NOW))),
        state,
      ).toBe("conflict");
    }
  });
});

describe("expire", () => {
  test("past its queue timeout a first attempt expires; past its deadline any waiting attempt times out", () => {
    expect(rec(expire(job("queued", { expiresAt: at(-1) }), NOW))).toMatchObject({ state: "expired", error: { code: "expired" } });
    expect(rec(expire(job("queued", { attempt: 1, expiresAt: at(-1) }), NOW))).toBeNull(); // a retry: the queue timeout was for the first start
    expect(rec(expire(job("queued", { attempt: 2, deadlineAt: at(-1) }), NOW))).toMatchObject({
      state: "timed_out",
      error: { code: "timed_out" },
    });
    expect(rec(expire(job("queued", { expiresAt: at(-5), deadlineAt: at(-1) }), NOW))?.state).toBe("timed_out");
  });

  test("not due yet, or no longer waiting: left as it is", () => {
    expect(rec(expire(job("queued", { expiresAt: at(1) }), NOW))).toBeNull();
    expect(rec(expire(job("queued"), NOW))).toBeNull();
    expect(rec(expire(job("running", { expiresAt: at(-1), deadlineAt: at(-1) }), NOW))).toBeNull();
    expect(waitingDueAt(job("queued", { expiresAt: at(5), deadlineAt: at(3) }))).toBe(Date.parse(at(3)));
    expect(waitingDueAt(job("succeeded", { deadlineAt: at(3) }))).toBeUndefined();
  });
});

describe("requeueEnded and buryUndelivered", () => {
  test("a dead job goes back to the queue with more attempts and its history; any other is a conflict", () => {
    const dead = job("dead", { attempt: 3, finishedAt: at(-5), history: [{ attempt: 3, state: "failed", finishedAt: at(-5) }] });
    expect(rec(requeueEnded(dead, 2, NOW))).toMatchObject({ state: "queued", queuedAt: NOW, attemptsAllowed: 5, history: dead.history });
    expect(rec(requeueEnded(dead, 2, NOW))?.finishedAt).toBeUndefined();
    expect(rec(requeueEnded(job("failed"), 2, NOW))).toMatchObject({ state: "queued" });
    expect(rec(requeueEnded({ ...job("cancelled"), cancelRequested: true }, 1, NOW))?.cancelRequested).toBeUndefined();
    expect(conflict(() => rec(requeueEnded(job("succeeded"), 2, NOW)))).toBe("conflict");
    expect(conflict(() => rec(requeueEnded(job("expired"), 2, NOW)))).toBe("conflict");
    expect(conflict(() => rec(requeueEnded({ ...job("timed_out"), deadlineAt: "2000-01-01T00:00:00.000Z" }, 2, NOW)))).toBe("conflict");
  });

  test("a running job JetStream gave up on ends dead, the attempt failed in its history", () => {
    const buried = rec(buryUndelivered(job("running", { attempt: 2, workerId: "w1" }), 20, NOW));
    expect(buried).toMatchObject({ state: "dead", finishedAt: NOW, error: { code: "internal" } });
    expect(buried?.error?.message).toContain("after 20 deliveries");
    expect(buried?.history).toEqual([{ attempt: 2, state: "failed", finishedAt: NOW, error: buried?.error, workerId: "w1" }]);
  });
});

describe("a worker's transitions", () => {
  const sandbox = { kind: "host" as const, id: "sbx-1", reason: "trusted agent" };

  test("a claim makes the next attempt the worker's, running in its sandbox, or failed with the refusal", () => {
    const running = rec(
      claim(job("queued", { attempt: 1, error: { code: "internal", message: "before" } }), {
        workerId: "w1",
        now: NOW,
        sandbox,
      }),
    );
    expect(running).toMatchObject({ state: "running", attempt: 2, workerId: "w1", startedAt: NOW, sandbox });
    expect(running?.error).toBeUndefined();
    expect(isOwnedBy(running as JobRecord, "w1", 2)).toBe(true);
    expect(isOwnedBy(running as JobRecord, "w2", 2) || isOwnedBy(running as JobRecord, "w1", 1)).toBe(false);
    const refusal = { code: "no_sandbox", message: "no docker here" };
    expect(rec(claim(job("queued"), { workerId: "w1", now: NOW, refusal }))).toMatchObject({ state: "failed", attempt: 1, error: refusal });
  });

  test("a claim of a job still running (its worker died, froze or lost NATS) records the takeover; a queued one's does not", () => {
    const by = { workerId: "w2", now: NOW, sandbox: { kind: "host" as const, id: "sbx-2", reason: "trusted" } };
    const stale = job("running", { attempt: 1, workerId: "w1", sandbox: { kind: "host", id: "sbx-1", reason: "trusted" } });
    expect(rec(claim(stale, by))).toMatchObject({
      attempt: 2,
      workerId: "w2",
      takeover: { attempt: 1, workerId: "w1", sandbox: "sbx-1", stopped: "lease" },
    });
    expect(rec(claim(job("queued", { attempt: 1 }), by))?.takeover).toBeUndefined();
  });

  test("a claim ends instead a job cancelled meanwhile, past its deadline, or a first attempt past its queue timeout; a finished job is left alone", () => {
    const by = { workerId: "w1", now: NOW, sandbox };
    expect(rec(claim(job("running", { cancelRequested: true }), by))?.state).toBe("cancelled");
    expect(rec(claim(job("queued", { attempt: 1, deadlineAt: at(-1) }), by))?.state).toBe("timed_out");
    expect(rec(claim(job("queued", { expiresAt: at(-1) }), by))?.state).toBe("expired");
    expect(rec(claim(job("queued", { attempt: 1, expiresAt: at(-1) }), by))?.state).toBe("running");
    expect(rec(claim(job("succeeded"), by))).toBeNull();
  });

  test("a hand-back queues the job again without using up an attempt; an outcome is written once, a retry keeps the history", () => {
    const running = job("running", { attempt: 1, workerId: "w1", sandbox, startedAt: at(-5), attemptsAllowed: 3 });
    expect(rec(handBack(running, NOW))).toMatchObject({ state: "queued", queuedAt: NOW, attemptsAllowed: 4, attempt: 1 });
    expect(rec(handBack(running, NOW))?.workerId).toBeUndefined();
    const error = { code: "agent_failed", message: "exit 1" };
    const end = { state: "failed" as const, now: NOW, sandbox, artifacts: [], error };
    expect(rec(finish(running, end))).toMatchObject({ state: "failed", finishedAt: NOW, error, sandbox });
    const ended = { attempt: 1, state: "failed" as const, finishedAt: NOW, error, workerId: "w1" };
    const retry = rec(endAttempt(running, ended, end, { kind: "retry", delayMs: 100 }));
    expect(retry).toMatchObject({ state: "queued", history: [ended], error, artifacts: [] });
    expect(retry?.workerId).toBeUndefined();
    expect(rec(endAttempt(running, ended, end, { kind: "dead" }))).toMatchObject({
      state: "dead",
      finishedAt: NOW,
      history: [ended],
      sandbox,
    });
  });
});

describe("delayed jobs and jobs in sessions", () => {
  test("release takes a waiting delayed job's runAt away once, and leaves other jobs alone", () => {
    const waiting = job("queued", { runAt: at(1_000) });
    const released = rec(release(waiting));
    expect(released).not.toBeNull();
    expect(released?.runAt).toBeUndefined();
    expect(rec(release(released as JobRecord))).toBeNull();
    expect(rec(release(job("cancelled", { runAt: at(1_000) })))).toBeNull();
    expect(rec(release(job("queued")))).toBeNull();
  });

  test("refuse ends a waiting job failed with the reason; a running or ended one is left", () => {
    const error = { code: "unknown_agent", message: "gone" };
    expect(rec(refuse(job("queued"), error, NOW))).toMatchObject({ state: "failed", error, finishedAt: NOW });
    expect(rec(refuse(job("running"), error, NOW))).toBeNull();
    expect(rec(refuse(job("succeeded"), error, NOW))).toBeNull();
  });

  test("loseSession ends a waiting or running job of a session session_lost; an ended one is left", () => {
    const session = { id: "ses-a", workerId: "w1" };
    expect(rec(loseSession(job("queued", { session }), "w1", NOW))).toMatchObject({ state: "failed", error: { code: "session_lost" } });
    expect(rec(loseSession(job("running", { session }), "w1", NOW))?.error?.message).toContain("while the job ran");
    expect(rec(loseSession(job("cancelled", { session }), "w1", NOW))).toBeNull();
    expect(rec(loseSession(job("queued", { session }), "w2", NOW))).toBeNull(); // another worker's session
  });
});

describe("each step's event tells of the record it writes", () => {
  const sandbox = { kind: "host" as const, id: "sbx-1", reason: "trusted agent" };
  const running = job("running", { attempt: 1, workerId: "w1", sandbox, attemptsAllowed: 2 });
  const error = { code: "agent_failed", message: "exit 1" };
  const end = { state: "failed" as const, now: NOW, sandbox, artifacts: [], error, message: "it failed" };
  const ended = { attempt: 1, state: "failed" as const, finishedAt: NOW, error, workerId: "w1" };

  test("the event's type, and its job, attempt and state are the record's", () => {
    const steps: [string, JobStep | null][] = [
      ["admitted", admit(job("queued"))],
      ["rejected", admit(job("rejected"))],
      ["cancelled", cancel(job("queued"), NOW)],
      ["cancel_requested", cancel(job("running"), NOW)],
      ["expired", expire(job("queued", { expiresAt: at(-1) }), NOW)],
      ["retrying", requeueEnded(job("failed"), 1, NOW)],
      ["dead", buryUndelivered(running, 5, NOW)],
      ["started", claim(job("queued"), { workerId: "w1", now: NOW, sandbox })],
      ["failed", claim(job("queued"), { workerId: "w1", now: NOW, refusal: error })],
      ["requeued", handBack(running, NOW)],
      ["failed", finish(running, end)],
      ["retrying", endAttempt(running, ended, end, { kind: "retry", delayMs: 100 })],
      ["dead", endAttempt(running, ended, end, { kind: "dead" })],
      ["failed", loseSession(job("queued", { session: { id: "ses-a", workerId: "w1" } }), "w1", NOW)],
      ["released", release(job("queued", { runAt: at(1_000) }))],
      ["released", givePlace(job("queued", { concurrency: { place: "a.x", waiting: true } }))],
      ["signal", keepSignal(job("queued"), { name: "go", payload: 1, at: NOW })],
      ["failed", refuse(job("queued"), error, NOW)],
      ["handoff", decideHandoff(job("succeeded"), { to: "b", jobId: "j2" })],
      ["handoff_refused", decideHandoff(job("succeeded"), { to: "b", error: { code: "handoff_refused", message: "no" } })],
    ];
    for (const [type, step] of steps) {
      expect(step?.event, type).toBeDefined();
      const { record, event } = step as Required<JobStep>;
      expect(event.type === type || (type === "admitted" && event.type === "queued"), type).toBe(true);
      expect({ jobId: event.jobId, attempt: event.attempt, state: event.state }, type).toEqual({
        jobId: record.id,
        attempt: record.attempt,
        state: record.state,
      });
    }
  });

  test("an admission folds accepted into queued; a started claim names its sandbox; an outcome carries its message", () => {
    expect(admit(job("queued"))?.event).toMatchObject({ type: "queued", folded: [{ type: "accepted", state: "accepted" }] });
    expect(claim(job("queued"), { workerId: "w1", now: NOW, sandbox })?.event).toMatchObject({ type: "started", sandbox });
    expect(finish(running, end).event).toMatchObject({ type: "failed", message: "it failed", error, sandbox });
    expect(endAttempt(running, ended, end, { kind: "retry", delayMs: 100 }).event?.message).toBe(
      "attempt 1 of 2 failed (exit 1); retrying in 100 ms",
    );
  });

  test("a change only the record shows has no event", () => {
    const waiting = job("queued", { concurrency: { place: "a.x", waiting: true } });
    expect(waitFor(waiting, "a.x", "a.y")?.event).toBeUndefined();
    expect(postpone(job("queued", { runAt: at(1_000) }), Date.parse(at(5_000)))?.event).toBeUndefined();
    expect(release(job("queued", { runAt: at(1_000) }), { place: "a.x", waiting: true })?.event).toBeUndefined();
    expect(takenOverSandboxRemoved(job("running", { takeover: { attempt: 1, stopped: "lease" } }))?.record.takeover?.stopped).toBe(
      "removed",
    );
  });
});
