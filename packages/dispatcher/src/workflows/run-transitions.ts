import {
  BoxcarError,
  ErrorCode,
  type ErrorInfo,
  handoffPending,
  isRunFinal,
  isTerminal,
  type JobRecord,
  PROTOCOL_VERSION,
  type Role,
  type StepInstance,
  type StepRun,
  type WorkflowEvent,
  type WorkflowRun,
  type WorkflowStep,
} from "@boxcar/protocol";

/**
 * Every change of a workflow run's record, as a pure function of the run as it stands and of
 * what happened, as `job-transitions.ts` in the protocol is for jobs (only the dispatchers change
 * runs, so this lives with them). Each returns the next run with the events that tell of the
 * change (`RunChange`), or null to leave the run as it is, and throws a `conflict` when what
 * happened cannot apply to the run's state. None changes what it is given. `Runs` writes the
 * result by compare-and-swap and, when another dispatcher wrote first, reads the run and applies
 * the transition again; `planRun` composes them into one advance.
 *
 * The run:
 *
 *   (workflows.start) --createRun--> running
 *   running --cancelRun (workflows.cancel, or a step's job cancelled on its own)--> cancelled
 *   running --failRun (a step failed, the deadline passed, the output cannot be rendered)--> failed
 *   running --succeedRun (every step succeeded or was skipped)--> succeeded
 *
 * A step:
 *
 *   pending --startStep--> running --settleStep (its instances ended) / settleApproval--> succeeded | failed | cancelled
 *   pending --skipStep--> skipped        pending --failStep (its condition or list cannot be rendered)--> failed
 *   running, an approval waiting --decideApproval--> running with the decision (settleApproval then settles it)
 *   pending, or an approval still waiting --(the run ends: endRun)--> cancelled
 *
 * An instance of a step (one job chain):
 *
 *   starting --recordStart--> running | failed       starting --failInstance (its input cannot be rendered)--> failed
 *   running --followJobs--> running (the next job of a handoff) | succeeded | failed | cancelled
 *   starting --(the run ends: endRun)--> cancelled
 */

/** A workflow event before it is stamped with the run's id, name, state and time. */
export type RunEventDraft = Pick<WorkflowEvent, "type"> &
  Partial<Pick<WorkflowEvent, "step" | "index" | "jobId" | "stepState" | "count" | "joined" | "message" | "error">>;

/** A run's next value, and the events to publish once it is written, in order. */
export interface RunChange {
  run: WorkflowRun;
  events: RunEventDraft[];
}

/** Job records by id: those of a run's current jobs. */
export type JobLookup = ReadonlyMap<string, JobRecord>;

/** What `workflows.start` decided a new run is. */
export interface RunStart {
  id: string;
  workflow: WorkflowRun["workflow"];
  input: WorkflowRun["input"];
  labels: WorkflowRun["labels"];
  /** The user who starts it, and its role (kept unless a submitter's). */
  owner: string;
  role: Role;
  /** The trace its jobs join: the start request's span. */
  traceparent?: string | undefined;
}

/** A new run: running, every step pending, its deadline (if its limits set one) counted from `now`. */
export function createRun(start: RunStart, now: string): RunChange {
  const { workflow } = start;
  const run: WorkflowRun = {
    v: PROTOCOL_VERSION,
    id: start.id,
    workflow,
    input: start.input,
    owner: start.owner,
    ...(start.role !== "submitter" ? { role: start.role } : {}),
    state: "running",
    createdAt: now,
    steps: Object.fromEntries(workflow.steps.map((s) => [s.name, { state: "pending", instances: [] } satisfies StepRun])),
    labels: start.labels,
    ...(workflow.limits.deadline !== undefined ? { deadline: new Date(Date.parse(now) + workflow.limits.deadline).toISOString() } : {}),
    ...(start.traceparent ? { traceparent: start.traceparent } : {}),
  };
  return { run, events: [{ type: "started", message: `workflow ${workflow.name} started with ${workflow.steps.length} steps` }] };
}

/**
 * Ends a run in `state`: steps not started are cancelled, and so are approvals still waiting and
 * instances not yet admitted. The building block of the three ends below.
 */
export function endRun(run: WorkflowRun, state: "succeeded" | "failed" | "cancelled", at: string, error?: ErrorInfo): WorkflowRun {
  const reason = `the run ${state === "cancelled" ? "was cancelled" : "failed"}`;
  const steps = Object.fromEntries(
    Object.entries(run.steps).map(([name, step]) => {
      // An approval still waiting (or decided, not yet settled) is no longer asked for.
      const ended: StepRun =
        step.state === "pending" || (step.state === "running" && step.approval)
          ? { ...step, state: "cancelled", reason, finishedAt: at }
          : step;
      if (!ended.instances.some((i) => i.state === "starting")) return [name, ended];
      return [
        name,
        { ...ended, instances: ended.instances.map((i) => (i.state === "starting" ? { ...i, state: "cancelled" as const } : i)) },
      ];
    }),
  );
  return { ...run, state, finishedAt: at, ...(error ? { error } : {}), steps };
}

/**
 * A cancel (`workflows.cancel`, or one of its steps' jobs cancelled on its own): a running run
 * ends `cancelled`, its running steps' jobs left for the plan to cancel. Cancelled already: left
 * as it is. Ended otherwise: a conflict.
 */
export function cancelRun(run: WorkflowRun, message: string, at: string): RunChange | null {
  if (run.state === "cancelled") return null;
  if (isRunFinal(run.state)) throw new BoxcarError(ErrorCode.conflict, `workflow run ${run.id} already ended ${run.state}`);
  return { run: endRun(run, "cancelled", at, { code: ErrorCode.cancelled, message }), events: [{ type: "cancelled", message }] };
}

/** A run that cannot go on (a step failed, its deadline passed, its output cannot be rendered) ends `failed`. */
export function failRun(run: WorkflowRun, message: string, at: string): RunChange {
  const error: ErrorInfo = { code: ErrorCode.workflowFailed, message };
  return { run: endRun(run, "failed", at, error), events: [{ type: "failed", message, error }] };
}

/** Every step succeeded or was skipped: the run ends `succeeded` with its output. */
export function succeedRun(run: WorkflowRun, output: WorkflowRun["output"], at: string): RunChange {
  return {
    run: endRun({ ...run, output }, "succeeded", at),
    events: [{ type: "succeeded", message: `all ${run.workflow.steps.length} steps done` }],
  };
}

/** A decision on an approval step, as its approver gives it. */
export interface ApprovalDecision {
  decision: "approved" | "rejected";
  by: string;
  at: string;
  comment?: string;
}

/**
 * An approver's decision on a step that waits for one: kept on the step (`settleApproval` then
 * settles it). A conflict when the step was decided already, its deadline passed before `at`,
 * or it does not wait (it is not running, or the run ended). Who may decide is the caller's to check.
 */
export function decideApproval(run: WorkflowRun, name: string, decided: ApprovalDecision): RunChange {
  const step = run.steps[name];
  if (step?.approval?.decision) {
    throw new BoxcarError(ErrorCode.conflict, `step ${name} was ${step.approval.decision} by ${step.approval.by} already`);
  }
  if (step?.approval && Date.parse(step.approval.deadline) <= Date.parse(decided.at)) {
    throw new BoxcarError(ErrorCode.conflict, `step ${name} of run ${run.id} waited until ${step.approval.deadline}: too late to decide`);
  }
  if (run.state !== "running" || step?.state !== "running" || !step.approval) {
    throw new BoxcarError(
      ErrorCode.conflict,
      `step ${name} of run ${run.id} is not waiting for an approval (it is ${step?.state}; the run is ${run.state})`,
    );
  }
  const message = `${name} ${decided.decision} by ${decided.by}${decided.comment ? `: ${decided.comment}` : ""}`;
  return {
    run: withStep(run, name, { ...step, approval: { ...step.approval, ...decided } }),
    events: [{ type: "approval_decided", step: name, message }],
  };
}

/** What admitting an instance's job came to: its job, or why it was refused. */
export type StartOutcome = { jobId: string } | { error: ErrorInfo };

/**
 * An instance's job admitted (`running`, with that job) or refused (`failed`, with why). Null
 * when the instance no longer waits to start: the run ended, or another dispatcher recorded it.
 */
export function recordStart(run: WorkflowRun, step: string, index: number, outcome: StartOutcome): RunChange | null {
  const inst = run.steps[step]?.instances.find((i) => i.index === index);
  if (inst?.state !== "starting") return null;
  const item = run.workflow.steps.find((s) => s.name === step)?.forEach !== undefined ? { index } : {};
  if ("jobId" in outcome) {
    const { jobId } = outcome;
    return {
      run: withInstance(run, step, { ...inst, state: "running", jobs: [jobId] }),
      events: [{ type: "step_started", step, ...item, jobId, message: `${step} started as job ${jobId}` }],
    };
  }
  const { error } = outcome;
  return {
    run: withInstance(run, step, { ...inst, state: "failed", error }),
    events: [{ type: "step_finished", step, ...item, stepState: "failed", message: error.message, error }],
  };
}

/** An instance whose job's input cannot be rendered fails before it is admitted (its step then fails). */
export function failInstance(run: WorkflowRun, step: string, index: number, error: ErrorInfo): RunChange {
  const inst = instanceOf(run, step, index);
  return { run: withInstance(run, step, { ...inst, state: "failed", error }), events: [] };
}

/**
 * Moves a running instance along its job chain as far as its jobs' records allow: to the next
 * job of each handoff, then, at the chain's last job's end, to its own end with that job's
 * output, summary and error. Null while its current job goes on (or has a handoff undecided).
 */
export function followJobs(run: WorkflowRun, step: WorkflowStep, index: number, jobs: JobLookup): RunChange | null {
  const before = instanceOf(run, step.name, index);
  let inst = before;
  const events: RunEventDraft[] = [];
  for (;;) {
    const job = jobs.get(inst.jobs.at(-1) ?? "");
    if (!job || !isTerminal(job.state) || handoffPending(job)) break;
    const next = job.handoff?.jobId;
    if (next && !inst.jobs.includes(next)) {
      inst = { ...inst, jobs: [...inst.jobs, next] };
      events.push({
        type: "handoff",
        step: step.name,
        ...(step.forEach !== undefined ? { index: inst.index } : {}),
        jobId: next,
        message: `${job.agent} handed off to ${job.handoff?.to} (job ${next})`,
      });
      continue;
    }
    const refused = job.handoff?.error;
    const state = job.state === "succeeded" && !refused ? "succeeded" : job.state === "cancelled" ? "cancelled" : "failed";
    const error =
      refused ?? job.error ?? (state === "failed" ? { code: job.state, message: `job ${job.id} ended ${job.state}` } : undefined);
    inst = {
      ...inst,
      state,
      ...(job.result?.output !== undefined ? { output: job.result.output } : {}),
      ...(job.result?.summary !== undefined ? { summary: job.result.summary } : {}),
      ...(error && state !== "succeeded" ? { error } : {}),
    };
    break;
  }
  return inst === before ? null : { run: withInstance(run, step.name, inst), events };
}

/** A running step whose instances all ended, or one of which failed: it ends as they did (failed, cancelled, else succeeded). */
export function settleStep(run: WorkflowRun, step: WorkflowStep, at: string): RunChange {
  const current = stepOf(run, step.name);
  const failed = current.instances.find((i) => i.state === "failed");
  const state = failed ? "failed" : current.instances.some((i) => i.state === "cancelled") ? "cancelled" : "succeeded";
  const settled: StepRun = {
    ...current,
    state,
    finishedAt: at,
    ...(failed ? { reason: `${step.forEach ? `item ${failed.index}: ` : ""}${failed.error?.message ?? "failed"}` } : {}),
  };
  return {
    run: withStep(run, step.name, settled),
    events: [
      {
        type: "step_finished",
        step: step.name,
        stepState: settled.state,
        ...(settled.reason ? { message: settled.reason } : {}),
        ...(failed?.error ? { error: failed.error } : {}),
      },
    ],
  };
}

/**
 * An approval step that waits: approved, it succeeds (its output `{ approved, by, comment? }`);
 * rejected, or past its deadline with no decision, it fails (and so does the run). A decision
 * counts if it came before the deadline. Null while it still waits.
 */
export function settleApproval(run: WorkflowRun, step: WorkflowStep, now: number, at: string): RunChange | null {
  const current = stepOf(run, step.name);
  const approval = current.approval;
  if (current.state !== "running" || !approval) return null;
  const decided = approval.decision !== undefined && approval.at !== undefined && Date.parse(approval.at) <= Date.parse(approval.deadline);
  let settled: StepRun;
  if (decided && approval.decision === "approved") {
    const output = { approved: true, by: approval.by ?? null, ...(approval.comment ? { comment: approval.comment } : {}) };
    settled = {
      ...current,
      instances: [{ index: 0, state: "succeeded", jobs: [], output, summary: `approved by ${approval.by}` }],
      state: "succeeded",
      finishedAt: at,
    };
  } else if (decided && approval.decision === "rejected") {
    settled = {
      ...current,
      state: "failed",
      reason: `rejected by ${approval.by}${approval.comment ? `: ${approval.comment}` : ""}`,
      finishedAt: at,
    };
  } else if (Date.parse(approval.deadline) <= now) {
    settled = { ...current, state: "failed", reason: `nobody approved or rejected it before ${approval.deadline}`, finishedAt: at };
  } else return null;
  return {
    run: withStep(run, step.name, settled),
    events: [
      {
        type: "step_finished",
        step: step.name,
        stepState: settled.state,
        message: settled.state === "succeeded" ? `approved by ${approval.by}` : (settled.reason as string),
      },
    ],
  };
}

/** A pending step that will not run (its condition is false, or a step it needs was skipped). */
export function skipStep(run: WorkflowRun, name: string, reason: string, at: string): RunChange {
  return {
    run: withStep(run, name, { ...stepOf(run, name), state: "skipped", reason, finishedAt: at }),
    events: [{ type: "step_skipped", step: name, message: reason }],
  };
}

/** A pending step whose condition or fan-out list cannot be rendered: it fails as it starts. */
export function failStep(run: WorkflowRun, name: string, reason: string, at: string): RunChange {
  return {
    run: withStep(run, name, { ...stepOf(run, name), state: "failed", reason, startedAt: at, finishedAt: at }),
    events: [{ type: "step_finished", step: name, stepState: "failed", message: reason }],
  };
}

/**
 * A pending step whose needs are met starts: an approval step waits for a decision until its
 * timeout; any other gets `count` instances (one per fan-out item) waiting to be admitted.
 */
export function startStep(run: WorkflowRun, step: WorkflowStep, count: number, at: string): RunChange {
  const current = stepOf(run, step.name);
  if (step.approval) {
    // It waits for a decision (`workflows.approve`), or its deadline.
    const deadline = new Date(Date.parse(at) + step.approval.timeout).toISOString();
    const who = step.approval.approvers.length > 0 ? step.approval.approvers.join(", ") : "the run's owner";
    const message = `${step.name} waits for an approval by ${who} until ${deadline}${step.approval.message ? `: ${step.approval.message}` : ""}`;
    return {
      run: withStep(run, step.name, { ...current, state: "running", startedAt: at, approval: { requestedAt: at, deadline } }),
      events: [{ type: "approval_requested", step: step.name, message }],
    };
  }
  const events: RunEventDraft[] = [];
  if (step.needs.length > 1)
    events.push({ type: "joined", step: step.name, joined: step.needs, message: `${step.name} joins ${step.needs.join(", ")}` });
  if (step.forEach !== undefined)
    events.push({ type: "fanned_out", step: step.name, count, message: `${step.name} fans out to ${count} jobs` });
  const instances: StepInstance[] = Array.from({ length: count }, (_, index) => ({ index, state: "starting", jobs: [] }));
  return { run: withStep(run, step.name, { ...current, state: "running", startedAt: at, instances }), events };
}

function stepOf(run: WorkflowRun, name: string): StepRun {
  return run.steps[name] as StepRun;
}

function instanceOf(run: WorkflowRun, step: string, index: number): StepInstance {
  return stepOf(run, step).instances.find((i) => i.index === index) as StepInstance;
}

/** The run with its step `name` replaced (in its place among the steps). */
function withStep(run: WorkflowRun, name: string, step: StepRun): WorkflowRun {
  return { ...run, steps: { ...run.steps, [name]: step } };
}

/** The run with one instance of step `name` replaced: the one of the same index. */
function withInstance(run: WorkflowRun, name: string, inst: StepInstance): WorkflowRun {
  const step = stepOf(run, name);
  return withStep(run, name, { ...step, instances: step.instances.map((i) => (i.index === inst.index ? inst : i)) });
}
