import {
  BoxcarError,
  type JobRecord,
  type JobState,
  WorkflowDefinition,
  type WorkflowDefinitionInput,
  type WorkflowRun,
} from "@boxcar/protocol";
import { describe, expect, test } from "vitest";
import {
  cancelRun,
  createRun,
  decideApproval,
  endRun,
  failInstance,
  failRun,
  failStep,
  followJobs,
  type RunChange,
  recordStart,
  settleApproval,
  settleStep,
  skipStep,
  startStep,
  succeedRun,
} from "./run-transitions.js";

const NOW = "2026-11-24T12:00:00.000Z";
const at = (offsetMs: number) => new Date(Date.parse(NOW) + offsetMs).toISOString();

const PIPELINE: WorkflowDefinitionInput = {
  name: "pipeline",
  steps: [
    { name: "plan", agent: "planner" },
    { name: "write", agent: "writer", needs: ["plan"], forEach: "{{ steps.plan.output.sections }}" },
    { name: "review", approval: { timeout: 60_000, approvers: ["bob"] }, needs: ["write"] },
    { name: "publish", agent: "publisher", needs: ["plan", "review"] },
  ],
};

function newRun(definition: WorkflowDefinitionInput = PIPELINE, extra: { deadline?: number } = {}): WorkflowRun {
  const workflow = WorkflowDefinition.parse({ ...definition, ...(extra.deadline ? { limits: { deadline: extra.deadline } } : {}) });
  return createRun({ id: "r1", workflow, input: { topic: "raft" }, labels: {}, owner: "alice", role: "submitter" }, NOW).run;
}

const stepOf = (run: WorkflowRun, name: string) =>
  run.workflow.steps.find((s) => s.name === name) as WorkflowRun["workflow"]["steps"][number];

/** Applies a change, checking that the run it was given is left as it was. */
function apply(run: WorkflowRun, change: (run: WorkflowRun) => RunChange | null): RunChange {
  const before = JSON.stringify(run);
  const result = change(run);
  expect(JSON.stringify(run), "the run given is not changed").toBe(before);
  if (!result) throw new Error("no change");
  return result;
}

function job(id: string, state: JobState, extra: Partial<JobRecord> = {}): JobRecord {
  return {
    v: 1,
    id,
    agent: "writer",
    pool: "default",
    state,
    attempt: 1,
    createdAt: NOW,
    artifacts: [],
    history: [],
    ...extra,
  } as JobRecord;
}

/** The run with `plan` done, `write` started with two instances, the first admitted as job j1. */
function writing(): WorkflowRun {
  let run = newRun();
  run = apply(run, (r) => startStep(r, stepOf(r, "plan"), 1, NOW)).run;
  run = apply(run, (r) => recordStart(r, "plan", 0, { jobId: "j0" })).run;
  run = apply(run, (r) => followJobs(r, stepOf(r, "plan"), 0, new Map([["j0", job("j0", "succeeded")]]))).run;
  run = apply(run, (r) => settleStep(r, stepOf(r, "plan"), NOW)).run;
  run = apply(run, (r) => startStep(r, stepOf(r, "write"), 2, NOW)).run;
  return apply(run, (r) => recordStart(r, "write", 0, { jobId: "j1" })).run;
}

const codeOf = (f: () => unknown) => {
  try {
    f();
  } catch (err) {
    return err instanceof BoxcarError ? err.code : `not a BoxcarError: ${String(err)}`;
  }
  return "no error";
};

describe("createRun", () => {
  test("a run starts running with every step pending, its deadline counted from now, and a started event", () => {
    const workflow = WorkflowDefinition.parse({ ...PIPELINE, limits: { deadline: 60_000 } });
    const { run, events } = createRun(
      { id: "r1", workflow, input: null, labels: { team: "a" }, owner: "alice", role: "admin", traceparent: "00-a-b-01" },
      NOW,
    );
    expect(run).toMatchObject({ id: "r1", owner: "alice", role: "admin", state: "running", createdAt: NOW, deadline: at(60_000) });
    expect(run.traceparent).toBe("00-a-b-01");
    expect(Object.values(run.steps).map((s) => s.state)).toEqual(["pending", "pending", "pending", "pending"]);
    expect(events).toEqual([{ type: "started", message: "workflow pipeline started with 4 steps" }]);
  });

  test("a submitter's run keeps no role, and a run without a deadline has none", () => {
    const { run } = createRun(
      { id: "r1", workflow: WorkflowDefinition.parse(PIPELINE), input: null, labels: {}, owner: "a", role: "submitter" },
      NOW,
    );
    expect(run.role).toBeUndefined();
    expect(run.deadline).toBeUndefined();
  });
});

describe("ending a run", () => {
  test("endRun cancels the steps not started, the approvals still waiting and the instances not admitted; running jobs' instances stay", () => {
    let run = writing();
    run = apply(run, (r) => startStep(r, stepOf(r, "review"), 1, NOW)).run; // not as a plan would, but an approval waiting
    const ended = endRun(run, "failed", at(1), { code: "workflow_failed", message: "x" });
    expect(ended).toMatchObject({ state: "failed", finishedAt: at(1), error: { code: "workflow_failed" } });
    expect(ended.steps.publish).toMatchObject({ state: "cancelled", reason: "the run failed", finishedAt: at(1) });
    expect(ended.steps.review).toMatchObject({ state: "cancelled", reason: "the run failed" });
    expect(ended.steps.write?.state).toBe("running");
    expect(ended.steps.write?.instances.map((i) => i.state)).toEqual(["running", "cancelled"]);
    expect(run.state).toBe("running");
  });

  test("cancelRun: a running run ends cancelled with its message; cancelled already: left as it is; ended otherwise: a conflict", () => {
    const { run, events } = apply(writing(), (r) => cancelRun(r, "cancelled by request", at(1)));
    expect(run).toMatchObject({ state: "cancelled", error: { code: "cancelled", message: "cancelled by request" } });
    expect(run.steps.publish?.reason).toBe("the run was cancelled");
    expect(events).toEqual([{ type: "cancelled", message: "cancelled by request" }]);
    expect(cancelRun(run, "again", at(2))).toBeNull();
    const failed = failRun(writing(), "step write failed", NOW).run;
    expect(codeOf(() => cancelRun(failed, "too late", at(2)))).toBe("conflict");
  });

  test("failRun ends the run failed with a workflow_failed error, told in its event", () => {
    const { run, events } = apply(writing(), (r) => failRun(r, "the run passed its deadline", at(1)));
    const error = { code: "workflow_failed", message: "the run passed its deadline" };
    expect(run).toMatchObject({ state: "failed", error });
    expect(events).toEqual([{ type: "failed", message: "the run passed its deadline", error }]);
  });

  test("succeedRun ends the run succeeded with its output", () => {
    const { run, events } = apply(newRun(), (r) => succeedRun(r, { done: true }, at(1)));
    expect(run).toMatchObject({ state: "succeeded", output: { done: true }, finishedAt: at(1) });
    expect(events).toEqual([{ type: "succeeded", message: "all 4 steps done" }]);
  });
});

describe("steps", () => {
  test("startStep: a job step gets one starting instance per item, and tells of a join and a fan-out", () => {
    const run = writing();
    expect(run.steps.write).toMatchObject({ state: "running", startedAt: NOW });
    const { run: next, events } = apply(newRun(), (r) => startStep(r, stepOf(r, "publish"), 1, NOW));
    expect(next.steps.publish?.instances).toEqual([{ index: 0, state: "starting", jobs: [] }]);
    expect(events).toEqual([{ type: "joined", step: "publish", joined: ["plan", "review"], message: "publish joins plan, review" }]);
    const fanned = apply(newRun(), (r) => startStep(r, stepOf(r, "write"), 3, NOW));
    expect(fanned.run.steps.write?.instances).toHaveLength(3);
    expect(fanned.events).toEqual([{ type: "fanned_out", step: "write", count: 3, message: "write fans out to 3 jobs" }]);
  });

  test("startStep: an approval step waits for a decision until its timeout", () => {
    const { run, events } = apply(newRun(), (r) => startStep(r, stepOf(r, "review"), 1, NOW));
    expect(run.steps.review).toMatchObject({ state: "running", startedAt: NOW, approval: { requestedAt: NOW, deadline: at(60_000) } });
    expect(events).toEqual([
      { type: "approval_requested", step: "review", message: `review waits for an approval by bob until ${at(60_000)}` },
    ]);
  });

  test("skipStep and failStep end a pending step with their reason", () => {
    const skipped = apply(newRun(), (r) => skipStep(r, "write", "its condition is false", NOW));
    expect(skipped.run.steps.write).toMatchObject({ state: "skipped", reason: "its condition is false", finishedAt: NOW });
    expect(skipped.events).toEqual([{ type: "step_skipped", step: "write", message: "its condition is false" }]);
    const failed = apply(newRun(), (r) => failStep(r, "write", "forEach is not a list", NOW));
    expect(failed.run.steps.write).toMatchObject({ state: "failed", reason: "forEach is not a list", startedAt: NOW, finishedAt: NOW });
    expect(failed.events).toEqual([{ type: "step_finished", step: "write", stepState: "failed", message: "forEach is not a list" }]);
  });

  test("settleStep: a step ends failed if an instance failed (naming the item), else cancelled if one was, else succeeded", () => {
    let run = writing();
    run = apply(run, (r) => failInstance(r, "write", 1, { code: "invalid", message: "bad input" })).run;
    const failed = apply(run, (r) => settleStep(r, stepOf(r, "write"), at(1)));
    expect(failed.run.steps.write).toMatchObject({ state: "failed", reason: "item 1: bad input", finishedAt: at(1) });
    expect(failed.events).toEqual([
      {
        type: "step_finished",
        step: "write",
        stepState: "failed",
        message: "item 1: bad input",
        error: { code: "invalid", message: "bad input" },
      },
    ]);
    const done = apply(writing(), (r) => recordStart(r, "write", 1, { jobId: "j2" })).run;
    const jobs = new Map([
      ["j1", job("j1", "succeeded")],
      ["j2", job("j2", "cancelled")],
    ]);
    const followed = [0, 1].reduce((r, i) => apply(r, (x) => followJobs(x, stepOf(x, "write"), i, jobs)).run, done);
    expect(apply(followed, (r) => settleStep(r, stepOf(r, "write"), at(1))).run.steps.write?.state).toBe("cancelled");
  });

  test("settleApproval: approved before its deadline it succeeds with the decision as output; rejected or too late, it fails", () => {
    const waiting = apply(newRun(), (r) => startStep(r, stepOf(r, "review"), 1, NOW)).run;
    expect(settleApproval(waiting, stepOf(waiting, "review"), Date.parse(at(1_000)), at(1_000))).toBeNull();

    const approved = apply(waiting, (r) => decideApproval(r, "review", { decision: "approved", by: "bob", at: at(1), comment: "go" })).run;
    const settled = apply(approved, (r) => settleApproval(r, stepOf(r, "review"), Date.parse(at(2)), at(2)));
    expect(settled.run.steps.review).toMatchObject({ state: "succeeded", finishedAt: at(2) });
    expect(settled.run.steps.review?.instances).toEqual([
      { index: 0, state: "succeeded", jobs: [], output: { approved: true, by: "bob", comment: "go" }, summary: "approved by bob" },
    ]);
    expect(settled.events).toEqual([{ type: "step_finished", step: "review", stepState: "succeeded", message: "approved by bob" }]);

    const rejected = apply(waiting, (r) => decideApproval(r, "review", { decision: "rejected", by: "bob", at: at(1) })).run;
    expect(apply(rejected, (r) => settleApproval(r, stepOf(r, "review"), Date.parse(at(2)), at(2))).run.steps.review).toMatchObject({
      state: "failed",
      reason: "rejected by bob",
    });
    const late = apply(waiting, (r) => settleApproval(r, stepOf(r, "review"), Date.parse(at(60_000)), at(60_000)));
    expect(late.run.steps.review).toMatchObject({ state: "failed", reason: `nobody approved or rejected it before ${at(60_000)}` });
  });

  test("decideApproval: kept on a waiting step, once; decided already, too late, or not waiting: a conflict", () => {
    const waiting = apply(newRun(), (r) => startStep(r, stepOf(r, "review"), 1, NOW)).run;
    const { run, events } = apply(waiting, (r) => decideApproval(r, "review", { decision: "approved", by: "bob", at: at(1) }));
    expect(run.steps.review?.approval).toEqual({ requestedAt: NOW, deadline: at(60_000), decision: "approved", by: "bob", at: at(1) });
    expect(events).toEqual([{ type: "approval_decided", step: "review", message: "review approved by bob" }]);
    expect(codeOf(() => decideApproval(run, "review", { decision: "rejected", by: "carol", at: at(2) }))).toBe("conflict");
    expect(codeOf(() => decideApproval(waiting, "review", { decision: "approved", by: "bob", at: at(60_000) }))).toBe("conflict");
    expect(codeOf(() => decideApproval(newRun(), "review", { decision: "approved", by: "bob", at: at(1) }))).toBe("conflict");
    const cancelled = apply(waiting, (r) => cancelRun(r, "cancelled by request", at(1))).run;
    expect(codeOf(() => decideApproval(cancelled, "review", { decision: "approved", by: "bob", at: at(2) }))).toBe("conflict");
  });
});

describe("instances", () => {
  test("recordStart: an admitted job makes its instance running; a refusal fails it; one no longer starting is left as it is", () => {
    const run = writing();
    expect(run.steps.write?.instances[0]).toEqual({ index: 0, state: "running", jobs: ["j1"] });
    const refused = apply(run, (r) => recordStart(r, "write", 1, { error: { code: "unknown_agent", message: "step write: no agent" } }));
    expect(refused.run.steps.write?.instances[1]).toMatchObject({ state: "failed", error: { code: "unknown_agent" } });
    expect(refused.events).toEqual([
      {
        type: "step_finished",
        step: "write",
        index: 1,
        stepState: "failed",
        message: "step write: no agent",
        error: { code: "unknown_agent", message: "step write: no agent" },
      },
    ]);
    expect(recordStart(run, "write", 0, { jobId: "j9" })).toBeNull();
    expect(recordStart(cancelRun(run, "cancelled by request", NOW)?.run as WorkflowRun, "write", 1, { jobId: "j9" })).toBeNull();
    const started = apply(run, (r) => recordStart(r, "write", 1, { jobId: "j2" }));
    expect(started.events).toEqual([{ type: "step_started", step: "write", index: 1, jobId: "j2", message: "write started as job j2" }]);
  });

  test("failInstance fails an instance whose input cannot be rendered", () => {
    const run = apply(writing(), (r) => failInstance(r, "write", 1, { code: "invalid", message: "the input of step write: x" })).run;
    expect(run.steps.write?.instances[1]).toEqual({
      index: 1,
      state: "failed",
      jobs: [],
      error: { code: "invalid", message: "the input of step write: x" },
    });
  });

  test("followJobs: along each handoff to the chain's last job, then to its end with its output and summary", () => {
    const jobs = new Map([
      ["j1", job("j1", "succeeded", { handoff: { to: "editor", jobId: "j5" } })],
      [
        "j5",
        job("j5", "succeeded", {
          agent: "editor",
          result: { exitCode: 0, signal: null, durationMs: 1, output: { text: "done" }, summary: "edited" },
        }),
      ],
    ]);
    const { run, events } = apply(writing(), (r) => followJobs(r, stepOf(r, "write"), 0, jobs));
    expect(run.steps.write?.instances[0]).toEqual({
      index: 0,
      state: "succeeded",
      jobs: ["j1", "j5"],
      output: { text: "done" },
      summary: "edited",
    });
    expect(events).toEqual([{ type: "handoff", step: "write", index: 0, jobId: "j5", message: "writer handed off to editor (job j5)" }]);
  });

  test("followJobs: a job still going, or with a handoff undecided, leaves the instance as it is", () => {
    expect(followJobs(writing(), stepOf(writing(), "write"), 0, new Map([["j1", job("j1", "running")]]))).toBeNull();
    const pending = job("j1", "succeeded", { result: { handoff: { to: "editor", input: null, carryFiles: true } } as JobRecord["result"] });
    expect(followJobs(writing(), stepOf(writing(), "write"), 0, new Map([["j1", pending]]))).toBeNull();
    expect(followJobs(writing(), stepOf(writing(), "write"), 0, new Map())).toBeNull();
  });

  test("followJobs: a refused handoff or a job that did not succeed fails the instance with why", () => {
    const refused = job("j1", "succeeded", { handoff: { to: "editor", error: { code: "invalid", message: "not declared" } } });
    expect(
      apply(writing(), (r) => followJobs(r, stepOf(r, "write"), 0, new Map([["j1", refused]]))).run.steps.write?.instances[0],
    ).toMatchObject({
      state: "failed",
      error: { code: "invalid", message: "not declared" },
    });
    expect(
      apply(writing(), (r) => followJobs(r, stepOf(r, "write"), 0, new Map([["j1", job("j1", "timed_out")]]))).run.steps.write
        ?.instances[0],
    ).toMatchObject({ state: "failed", error: { code: "timed_out", message: "job j1 ended timed_out" } });
    expect(
      apply(writing(), (r) => followJobs(r, stepOf(r, "write"), 0, new Map([["j1", job("j1", "cancelled")]]))).run.steps.write
        ?.instances[0],
    ).toMatchObject({ state: "cancelled" });
  });
});
