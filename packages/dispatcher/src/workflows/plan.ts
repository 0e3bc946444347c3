import {
  ErrorCode,
  type ErrorInfo,
  handoffPending,
  type InputFileRef,
  isTerminal,
  type JobRecord,
  type JobSpecInput,
  MAX_FAN_OUT,
  render,
  type StepInstance,
  type StepRun,
  TemplateError,
  truthy,
  type WorkflowEvent,
  type WorkflowRun,
  type WorkflowStep,
} from "@boxcar/protocol";

/** A workflow event before it is stamped with the run's id, name, state and time. */
export type RunEventDraft = Pick<WorkflowEvent, "type"> &
  Partial<Pick<WorkflowEvent, "step" | "index" | "jobId" | "stepState" | "count" | "joined" | "message" | "error">>;

/** A step instance whose job is to be admitted. */
export interface PlannedStart {
  step: string;
  index: number;
  spec: JobSpecInput;
}

export interface RunPlan {
  /** The run as it should be written next. */
  run: WorkflowRun;
  changed: boolean;
  /** Instances decided but not admitted: admit each under its key, then record its job. */
  starts: PlannedStart[];
  /** Jobs to cancel: the run ended while they were still going. */
  cancels: string[];
  /** Events to publish once the run is written. */
  events: RunEventDraft[];
}

/** Reads job records by id: only those `jobsToRead` names are needed. */
export type JobLookup = ReadonlyMap<string, JobRecord>;

/**
 * The next state of a run, decided from its record and its jobs' records alone (no I/O), so any
 * dispatcher computes the same plan and a compare-and-swap decides which one writes it: jobs
 * that ended move their instances and steps on; a failed step or a passed deadline fails the
 * run; steps whose needs are met start (or are skipped by their condition); the run ends when
 * every step has.
 */
export function planRun(current: WorkflowRun, jobs: JobLookup, now: number): RunPlan {
  const run = structuredClone(current);
  const events: RunEventDraft[] = [];
  let starts: PlannedStart[] | undefined;
  // A start whose input cannot be rendered fails its instance, so the run is settled again.
  while (starts === undefined) {
    settle(run, jobs, now, events);
    starts = collectStarts(run, jobs);
  }
  const cancels: string[] = [];
  if (run.state !== "running") {
    for (const state of Object.values(run.steps)) {
      for (const inst of state.instances) {
        const last = jobs.get(inst.jobs.at(-1) ?? "");
        if (inst.state === "running" && last && !isTerminal(last.state) && !last.cancelRequested) cancels.push(last.id);
      }
    }
  }
  return { run, changed: JSON.stringify(run) !== JSON.stringify(current), starts, cancels, events };
}

/** Settles steps, ends the run or starts ready steps until nothing changes: a skip or an empty fan-out can unblock more. */
function settle(run: WorkflowRun, jobs: JobLookup, now: number, events: RunEventDraft[]): void {
  const at = new Date(now).toISOString();
  const steps = run.workflow.steps;
  const stepOf = (name: string) => run.steps[name] as StepRun;
  for (let progress = true; progress; ) {
    progress = false;
    for (const step of steps) {
      const state = stepOf(step.name);
      if (step.approval) {
        if (settleApproval(step, state, now, at, events)) progress = true;
        continue;
      }
      for (const inst of state.instances) if (inst.state === "running") followJobs(step, inst, jobs, events);
      // A step fails as soon as one of its instances does (the run then cancels the others).
      const settled = state.instances.every((i) => i.state !== "starting" && i.state !== "running");
      if (state.state === "running" && (settled || state.instances.some((i) => i.state === "failed"))) {
        settleStep(step, state, at, events);
        progress = true;
      }
    }
    if (run.state !== "running") continue;

    const cancelled = steps.find((s) => stepOf(s.name).state === "cancelled");
    if (cancelled) {
      // One of its jobs was cancelled on its own (`boxcar cancel JOB`): the run cannot go on.
      const message = `step ${cancelled.name} was cancelled`;
      endRun(run, "cancelled", at, { code: ErrorCode.cancelled, message });
      events.push({ type: "cancelled", message });
      progress = true;
      continue;
    }
    const failed = steps.find((s) => stepOf(s.name).state === "failed");
    const pastDeadline = run.deadline !== undefined && Date.parse(run.deadline) <= now;
    if (failed || pastDeadline) {
      const message = failed
        ? `step ${failed.name} failed: ${stepOf(failed.name).reason ?? "no reason given"}`
        : `the run passed its deadline of ${run.deadline}`;
      endRun(run, "failed", at, { code: ErrorCode.workflowFailed, message });
      events.push({ type: "failed", message, error: run.error as ErrorInfo });
      progress = true;
      continue;
    }

    for (const step of steps) {
      const state = stepOf(step.name);
      if (state.state !== "pending") continue;
      const needs = step.needs.map((n) => [n, stepOf(n).state] as const);
      if (needs.some(([, s]) => s !== "succeeded" && s !== "skipped")) continue;
      progress = true;
      const skippedNeed = needs.find(([, s]) => s === "skipped");
      if (skippedNeed) skip(step.name, state, `it needs ${skippedNeed[0]}, which was skipped`, at, events);
      else startStep(run, step, state, at, events);
    }

    if (steps.every((s) => ["succeeded", "skipped"].includes(stepOf(s.name).state))) {
      progress = true;
      try {
        run.output = runOutput(run) as WorkflowRun["output"];
        endRun(run, "succeeded", at);
        events.push({ type: "succeeded", message: `all ${steps.length} steps done` });
      } catch (err) {
        if (!(err instanceof TemplateError)) throw err;
        const message = `the workflow's output: ${err.message}`;
        endRun(run, "failed", at, { code: ErrorCode.workflowFailed, message });
        events.push({ type: "failed", message, error: run.error as ErrorInfo });
      }
    }
  }
}

/** The specs of the instances waiting to be admitted; undefined when one could not be rendered (it is failed instead). */
function collectStarts(run: WorkflowRun, jobs: JobLookup): PlannedStart[] | undefined {
  const starts: PlannedStart[] = [];
  if (run.state !== "running") return starts;
  const scope = scopeOf(run);
  for (const step of run.workflow.steps) {
    const waiting = (run.steps[step.name] as StepRun).instances.filter((i) => i.state === "starting");
    if (waiting.length === 0) continue;
    // What every instance of the step shares: its fan-out list and the needed steps' files.
    let items: unknown[] | undefined;
    let files: InputFileRef[] | undefined;
    for (const inst of waiting) {
      try {
        items ??= step.forEach !== undefined ? (render(step.forEach, scope) as unknown[]) : [];
        files ??= step.files === "needs" ? neededFiles(run, step, jobs) : [];
        starts.push({ step: step.name, index: inst.index, spec: stepSpec(run, step, scope, inst.index, items[inst.index] ?? null, files) });
      } catch (err) {
        if (!(err instanceof TemplateError)) throw err;
        inst.state = "failed";
        inst.error = { code: ErrorCode.invalid, message: `the input of step ${step.name}: ${err.message}` };
        return undefined;
      }
    }
  }
  return starts;
}

/** Moves an instance along its job chain: to the next job after a handoff, or to its end. */
function followJobs(step: WorkflowStep, inst: StepInstance, jobs: JobLookup, events: RunEventDraft[]): void {
  for (;;) {
    const job = jobs.get(inst.jobs.at(-1) ?? "");
    if (!job || !isTerminal(job.state) || handoffPending(job)) return;
    const next = job.handoff?.jobId;
    if (next && !inst.jobs.includes(next)) {
      inst.jobs.push(next);
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
    inst.state = job.state === "succeeded" && !refused ? "succeeded" : job.state === "cancelled" ? "cancelled" : "failed";
    if (job.result?.output !== undefined) inst.output = job.result.output;
    if (job.result?.summary !== undefined) inst.summary = job.result.summary;
    const error =
      refused ?? job.error ?? (inst.state === "failed" ? { code: job.state, message: `job ${job.id} ended ${job.state}` } : undefined);
    if (error && inst.state !== "succeeded") inst.error = error;
    return;
  }
}

function settleStep(step: WorkflowStep, state: StepRun, at: string, events: RunEventDraft[]): void {
  const failed = state.instances.find((i) => i.state === "failed");
  state.state = failed ? "failed" : state.instances.some((i) => i.state === "cancelled") ? "cancelled" : "succeeded";
  state.finishedAt = at;
  if (failed) state.reason = `${step.forEach ? `item ${failed.index}: ` : ""}${failed.error?.message ?? "failed"}`;
  events.push({
    type: "step_finished",
    step: step.name,
    stepState: state.state,
    ...(state.reason ? { message: state.reason } : {}),
    ...(failed?.error ? { error: failed.error } : {}),
  });
}

/**
 * An approval step that waits: approved, it succeeds (its output `{ approved, by, comment? }`);
 * rejected, or past its deadline with no decision, it fails (and so does the run). Whether it moved.
 */
function settleApproval(step: WorkflowStep, state: StepRun, now: number, at: string, events: RunEventDraft[]): boolean {
  const approval = state.approval;
  if (state.state !== "running" || !approval) return false;
  // A decision counts if it came before the deadline.
  const decided = approval.decision !== undefined && approval.at !== undefined && Date.parse(approval.at) <= Date.parse(approval.deadline);
  if (decided && approval.decision === "approved") {
    const output = { approved: true, by: approval.by ?? null, ...(approval.comment ? { comment: approval.comment } : {}) };
    state.instances = [{ index: 0, state: "succeeded", jobs: [], output, summary: `approved by ${approval.by}` }];
    state.state = "succeeded";
  } else if (decided && approval.decision === "rejected") {
    state.state = "failed";
    state.reason = `rejected by ${approval.by}${approval.comment ? `: ${approval.comment}` : ""}`;
  } else if (Date.parse(approval.deadline) <= now) {
    state.state = "failed";
    state.reason = `nobody approved or rejected it before ${approval.deadline}`;
  } else return false;
  state.finishedAt = at;
  events.push({
    type: "step_finished",
    step: step.name,
    stepState: state.state,
    message: state.state === "succeeded" ? `approved by ${approval.by}` : (state.reason as string),
  });
  return true;
}

function skip(name: string, state: StepRun, reason: string, at: string, events: RunEventDraft[]): void {
  state.state = "skipped";
  state.reason = reason;
  state.finishedAt = at;
  events.push({ type: "step_skipped", step: name, message: reason });
}

/** Evaluates the step's condition and fan-out, and makes its instances; template errors fail the step. */
function startStep(run: WorkflowRun, step: WorkflowStep, state: StepRun, at: string, events: RunEventDraft[]): void {
  const scope = scopeOf(run);
  let items: unknown[] = [null];
  try {
    if (step.if !== undefined && !truthy(render(step.if, scope))) {
      skip(step.name, state, `its condition ${step.if.trim()} is false`, at, events);
      return;
    }
    if (step.forEach !== undefined) {
      const list = render(step.forEach, scope);
      if (!Array.isArray(list))
        throw new TemplateError(`forEach ${step.forEach.trim()} is not a list (got ${JSON.stringify(list)?.slice(0, 80)})`);
      if (list.length > MAX_FAN_OUT)
        throw new TemplateError(`forEach ${step.forEach.trim()} has ${list.length} items; the limit is ${MAX_FAN_OUT}`);
      items = list;
    }
  } catch (err) {
    if (!(err instanceof TemplateError)) throw err;
    Object.assign(state, { state: "failed", reason: err.message, startedAt: at, finishedAt: at });
    events.push({ type: "step_finished", step: step.name, stepState: "failed", message: err.message });
    return;
  }
  state.state = "running";
  state.startedAt = at;
  if (step.approval) {
    // It waits for a decision (`workflows.approve`), or its deadline.
    const deadline = new Date(Date.parse(at) + step.approval.timeout).toISOString();
    state.approval = { requestedAt: at, deadline };
    const who = step.approval.approvers.length > 0 ? step.approval.approvers.join(", ") : "the run's owner";
    const message = `${step.name} waits for an approval by ${who} until ${deadline}${step.approval.message ? `: ${step.approval.message}` : ""}`;
    events.push({ type: "approval_requested", step: step.name, message });
    return;
  }
  state.instances = items.map((_, index) => ({ index, state: "starting", jobs: [] }));
  if (step.needs.length > 1)
    events.push({ type: "joined", step: step.name, joined: step.needs, message: `${step.name} joins ${step.needs.join(", ")}` });
  if (step.forEach !== undefined)
    events.push({ type: "fanned_out", step: step.name, count: items.length, message: `${step.name} fans out to ${items.length} jobs` });
}

/** What templates see: the run's input, and each step's output, summary and state (lists for a fan-out). */
function scopeOf(run: WorkflowRun): { input: unknown; steps: Record<string, unknown> } {
  const steps: Record<string, unknown> = {};
  for (const step of run.workflow.steps) {
    const state = run.steps[step.name] as StepRun;
    const done = state.instances.filter((i) => i.state === "succeeded");
    steps[step.name] = step.forEach
      ? { state: state.state, output: done.map((i) => i.output ?? null), summary: done.map((i) => i.summary ?? null) }
      : { state: state.state, output: done[0]?.output ?? null, summary: done[0]?.summary ?? null };
  }
  return { input: run.input, steps };
}

/** The job spec of one instance: its rendered input, the needed steps' files, the step's overrides. */
function stepSpec(
  run: WorkflowRun,
  step: WorkflowStep,
  scope: ReturnType<typeof scopeOf>,
  index: number,
  item: unknown,
  files: InputFileRef[],
): JobSpecInput {
  const input =
    step.input !== undefined
      ? render(step.input, { ...scope, item, index })
      : {
          input: run.input,
          steps: Object.fromEntries(step.needs.map((n) => [n, scope.steps[n]])),
          ...(step.forEach ? { item, index } : {}),
        };
  return {
    agent: step.agent as string, // an approval step starts no job
    input: input as JobSpecInput["input"],
    files,
    labels: { ...run.labels, "boxcar.run": run.id, "boxcar.step": step.name },
    ...(step.retry ? { retry: step.retry } : {}),
    ...(step.timeout !== undefined ? { timeout: step.timeout } : {}),
    ...(step.queueTimeout !== undefined ? { queueTimeout: step.queueTimeout } : {}),
    ...(step.pool ? { pool: step.pool } : {}),
    ...(step.priority ? { priority: step.priority } : {}),
  };
}

/** The needed steps' output files, under `in/<step>/` (and `in/<step>/<index>/` for a fan-out). */
function neededFiles(run: WorkflowRun, step: WorkflowStep, jobs: JobLookup): InputFileRef[] {
  const files: InputFileRef[] = [];
  for (const need of step.needs) {
    const fanOut = run.workflow.steps.find((s) => s.name === need)?.forEach !== undefined;
    for (const inst of (run.steps[need] as StepRun).instances) {
      // An approval's instance ran no job: it has no files.
      if (inst.state !== "succeeded" || inst.jobs.length === 0) continue;
      const job = jobs.get(inst.jobs.at(-1) ?? "");
      if (!job) throw new Error(`job ${inst.jobs.at(-1)} of step ${need} was not read`);
      const base = fanOut ? `in/${need}/${inst.index}` : `in/${need}`;
      for (const a of job.artifacts) files.push({ path: `${base}/${a.path}`, object: a.object });
    }
  }
  return files;
}

function runOutput(run: WorkflowRun): unknown {
  const scope = scopeOf(run);
  if (run.workflow.output !== undefined) return render(run.workflow.output, scope);
  const last = [...run.workflow.steps].reverse().find((s) => (run.steps[s.name] as StepRun).state === "succeeded");
  return last ? ((scope.steps[last.name] as { output: unknown }).output ?? null) : null;
}

/** Ends a run: steps not started are cancelled, and so are instances not yet admitted. */
export function endRun(run: WorkflowRun, state: "succeeded" | "failed" | "cancelled", at: string, error?: ErrorInfo): void {
  run.state = state;
  run.finishedAt = at;
  if (error) run.error = error;
  const reason = `the run ${state === "cancelled" ? "was cancelled" : "failed"}`;
  for (const s of Object.values(run.steps)) {
    if (s.state === "pending") Object.assign(s, { state: "cancelled", reason, finishedAt: at });
    // An approval still waiting (or decided, not yet settled) is no longer asked for.
    if (s.state === "running" && s.approval) Object.assign(s, { state: "cancelled", reason, finishedAt: at });
    for (const inst of s.instances) if (inst.state === "starting") inst.state = "cancelled";
  }
}

/** The job records a plan needs: every instance's current job, and the needed steps' final jobs. */
export function jobsToRead(run: WorkflowRun): string[] {
  const ids = new Set<string>();
  for (const state of Object.values(run.steps)) {
    for (const inst of state.instances) {
      const last = inst.jobs.at(-1);
      if (last && (inst.state === "running" || inst.state === "succeeded")) ids.add(last);
    }
  }
  return [...ids];
}
