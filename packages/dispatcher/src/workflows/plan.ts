import {
  ErrorCode,
  type InputFileRef,
  isTerminal,
  type JobSpecInput,
  type StepRun,
  type WorkflowRun,
  type WorkflowStep,
} from "@boxcar/protocol";
import { MAX_FAN_OUT, render, TemplateError, truthy } from "@boxcar/protocol/internal";
import {
  cancelRun,
  failInstance,
  failRun,
  failStep,
  followJobs,
  type JobLookup,
  type RunChange,
  type RunEventDraft,
  settleApproval,
  settleStep,
  skipStep,
  startStep,
  succeedRun,
} from "./run-transitions.js";

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

/**
 * The next state of a run, decided from its record and its jobs' records alone (no I/O), so any
 * dispatcher computes the same plan and a compare-and-swap decides which one writes it: jobs
 * that ended move their instances and steps on; a failed step or a passed deadline fails the
 * run; steps whose needs are met start (or are skipped by their condition); the run ends when
 * every step has. Each change is one of the run's transitions (`run-transitions.ts`).
 */
export function planRun(current: WorkflowRun, jobs: JobLookup, now: number): RunPlan {
  const events: RunEventDraft[] = [];
  let run = current;
  let starts: PlannedStart[] | undefined;
  // A start whose input cannot be rendered fails its instance, so the run is settled again.
  while (starts === undefined) {
    run = settle(run, jobs, now, events);
    const collected = collectStarts(run, jobs);
    if (Array.isArray(collected)) starts = collected;
    else run = collected.run;
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
function settle(current: WorkflowRun, jobs: JobLookup, now: number, events: RunEventDraft[]): WorkflowRun {
  let run = current;
  /** Takes a transition's change, if it made one; whether it did. */
  const apply = (change: RunChange | null): boolean => {
    if (!change) return false;
    run = change.run;
    events.push(...change.events);
    return true;
  };
  const at = new Date(now).toISOString();
  const steps = run.workflow.steps;
  const stepOf = (name: string) => run.steps[name] as StepRun;
  for (let progress = true; progress; ) {
    progress = false;
    for (const step of steps) {
      if (step.approval) {
        if (apply(settleApproval(run, step, now, at))) progress = true;
        continue;
      }
      for (const inst of stepOf(step.name).instances) if (inst.state === "running") apply(followJobs(run, step, inst.index, jobs));
      // A step fails as soon as one of its instances does (the run then cancels the others).
      const state = stepOf(step.name);
      const settled = state.instances.every((i) => i.state !== "starting" && i.state !== "running");
      if (state.state === "running" && (settled || state.instances.some((i) => i.state === "failed"))) {
        apply(settleStep(run, step, at));
        progress = true;
      }
    }
    if (run.state !== "running") continue;

    const cancelled = steps.find((s) => stepOf(s.name).state === "cancelled");
    if (cancelled) {
      // One of its jobs was cancelled on its own (`boxcar cancel JOB`): the run cannot go on.
      apply(cancelRun(run, `step ${cancelled.name} was cancelled`, at));
      progress = true;
      continue;
    }
    const failed = steps.find((s) => stepOf(s.name).state === "failed");
    const pastDeadline = run.deadline !== undefined && Date.parse(run.deadline) <= now;
    if (failed || pastDeadline) {
      const message = failed
        ? `step ${failed.name} failed: ${stepOf(failed.name).reason ?? "no reason given"}`
        : `the run passed its deadline of ${run.deadline}`;
      apply(failRun(run, message, at));
      progress = true;
      continue;
    }

    for (const step of steps) {
      if (stepOf(step.name).state !== "pending") continue;
      const needs = step.needs.map((n) => [n, stepOf(n).state] as const);
      if (needs.some(([, s]) => s !== "succeeded" && s !== "skipped")) continue;
      progress = true;
      const skippedNeed = needs.find(([, s]) => s === "skipped");
      apply(skippedNeed ? skipStep(run, step.name, `it needs ${skippedNeed[0]}, which was skipped`, at) : startReady(run, step, at));
    }

    if (steps.every((s) => ["succeeded", "skipped"].includes(stepOf(s.name).state))) {
      progress = true;
      let output: WorkflowRun["output"];
      try {
        output = runOutput(run) as WorkflowRun["output"];
      } catch (err) {
        if (!(err instanceof TemplateError)) throw err;
        apply(failRun(run, `the workflow's output: ${err.message}`, at));
        continue;
      }
      apply(succeedRun(run, output, at));
    }
  }
  return run;
}

/**
 * The specs of the instances waiting to be admitted; when one cannot be rendered, the change
 * that fails it instead (the run is then settled again).
 */
function collectStarts(run: WorkflowRun, jobs: JobLookup): PlannedStart[] | RunChange {
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
        return failInstance(run, step.name, inst.index, {
          code: ErrorCode.invalid,
          message: `the input of step ${step.name}: ${err.message}`,
        });
      }
    }
  }
  return starts;
}

/**
 * A step whose needs are met: its condition and fan-out list are rendered, and it is skipped
 * (the condition is false), fails (a template error) or starts with one instance per item.
 */
function startReady(run: WorkflowRun, step: WorkflowStep, at: string): RunChange {
  const scope = scopeOf(run);
  let count = 1;
  try {
    if (step.if !== undefined && !truthy(render(step.if, scope))) {
      return skipStep(run, step.name, `its condition ${step.if.trim()} is false`, at);
    }
    if (step.forEach !== undefined) {
      const list = render(step.forEach, scope);
      if (!Array.isArray(list))
        throw new TemplateError(`forEach ${step.forEach.trim()} is not a list (got ${JSON.stringify(list)?.slice(0, 80)})`);
      if (list.length > MAX_FAN_OUT)
        throw new TemplateError(`forEach ${step.forEach.trim()} has ${list.length} items; the limit is ${MAX_FAN_OUT}`);
      count = list.length;
    }
  } catch (err) {
    if (!(err instanceof TemplateError)) throw err;
    return failStep(run, step.name, err.message, at);
  }
  return startStep(run, step, count, at);
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
