import { z } from "zod";
import { AgentName, MAX_TIMEOUT_MS, PoolName, PROTOCOL_VERSION, RetryPolicy } from "./agent.js";
import { ErrorInfo } from "./errors.js";
import { TOKEN_PATTERN } from "./names.js";
import { Role } from "./principal.js";
import { Priority } from "./priority.js";
import { expressionsIn, formatReference, type Reference, stringsIn, TemplateError } from "./template.js";
import { Traceparent } from "./trace-context.js";
import { durationMs } from "./units.js";

/** Guards on a handoff chain; hitting one ends the chain with the reason. */
export const ChainLimits = z.strictObject({
  maxHops: z.number().int().min(0).max(100).default(10).describe("handoffs allowed in one chain"),
  maxVisits: z.number().int().min(1).max(100).default(5).describe("jobs of the same agent allowed in one chain"),
  deadline: durationMs({ min: 1_000, max: MAX_TIMEOUT_MS })
    .optional()
    .describe("time from the chain's first job (or the workflow's start) after which no handoff is made"),
});
export type ChainLimits = z.infer<typeof ChainLimits>;
export const DEFAULT_CHAIN_LIMITS: ChainLimits = { maxHops: 10, maxVisits: 5 };

/** What an agent writes under `handoff` in its result file to pass the work on. */
export const HandoffRequest = z.strictObject({
  to: AgentName.describe("the agent to hand to: one of this agent's `handoffs`"),
  input: z.json().default(null).describe("the next job's input"),
  carryFiles: z.boolean().default(true).describe("false: the next workspace starts without this job's output files"),
  stayInSession: z
    .boolean()
    .default(false)
    .describe("true: the next job runs in this job's session (docs/sessions.md#jobs-in-a-session), its files there as this job left them"),
});
export type HandoffRequest = z.infer<typeof HandoffRequest>;

/** One job of a chain, as the next agents see it in `$BOXCAR_CHAIN_FILE`. */
export const ChainEntry = z.strictObject({
  jobId: z.string(),
  agent: AgentName,
  summary: z.string().optional(),
});
export type ChainEntry = z.infer<typeof ChainEntry>;

/** Where a job sits in a handoff chain, and (for a workflow step) in which run and step. */
/**
 * A workflow step's limits, which bound every job of the step's handoff chain (docs/workflows.md):
 * each hop runs within the step's `timeout` (or its agent's own, if shorter), under the step's
 * `retry`, `queueTimeout` and `pool`.
 */
export const StepLimits = z.strictObject({
  retry: RetryPolicy.optional(),
  timeout: z.number().int().positive().optional().describe("ms"),
  queueTimeout: z.number().int().positive().optional().describe("ms"),
  pool: PoolName.optional(),
});
export type StepLimits = z.infer<typeof StepLimits>;

export const ChainLink = z.looseObject({
  root: z.string().describe("the chain's first job"),
  parent: z.string().optional().describe("the job that handed off to this one"),
  depth: z.number().int().nonnegative().describe("handoffs before this job"),
  history: z.array(ChainEntry).describe("the jobs before this one, oldest first"),
  limits: ChainLimits,
  /** When the chain stops handing off. */
  deadline: z.iso.datetime().optional(),
  run: z.string().optional(),
  step: z.string().optional(),
  index: z.number().int().nonnegative().optional(),
  /** The limits of the workflow step the chain is, for every hop of it. */
  stepLimits: StepLimits.optional(),
});
export type ChainLink = z.infer<typeof ChainLink>;

/** What the dispatcher made of a job's handoff request. */
export const HandoffDecision = z.strictObject({
  to: AgentName,
  /** The job the handoff became. */
  jobId: z.string().optional(),
  /** Why the handoff was refused: the chain ends here. */
  error: ErrorInfo.optional(),
});
export type HandoffDecision = z.infer<typeof HandoffDecision>;

export const StepName = z.string().regex(TOKEN_PATTERN, "a step name is 1-64 letters, digits, '-' or '_'");

/** The most jobs one fan-out may start. */
export const MAX_FAN_OUT = 100;

const Template = z.string().regex(/^\s*\{\{.*\}\}\s*$/, 'expected one template such as "{{ steps.plan.output.ok }}"');

/** A step that waits for a person's decision instead of running a job (docs/workflows.md#approvals). */
export const ApprovalStep = z.strictObject({
  timeout: durationMs({ min: 1_000, max: 30 * 86_400_000 }).describe("how long it waits; then the step fails, and the run"),
  approvers: z
    .array(z.string().regex(TOKEN_PATTERN, "a user name"))
    .max(100)
    .default([])
    .describe("the users who may approve or reject it (admins always may); none named: the run's owner"),
  message: z.string().max(4096).optional().describe("what the approvers are asked"),
});

export const WorkflowStep = z.strictObject({
  name: StepName,
  agent: AgentName.optional().describe("the agent the step's job runs (a step has this or `approval`)"),
  approval: ApprovalStep.optional().describe("the step waits for an approval instead of running a job"),
  needs: z.array(StepName).default([]).describe("steps that must succeed (or be skipped) first"),
  input: z
    .json()
    .optional()
    .describe("the job's input; strings may hold {{ templates }}; default: the workflow input and the needed steps' outputs"),
  forEach: Template.optional().describe("fan out: one job per item of this list ({{ item }} and {{ index }} in the input)"),
  if: Template.optional().describe("run only when this is true; otherwise the step (and steps that need it) are skipped"),
  files: z
    .enum(["needs", "none"])
    .default("needs")
    .describe("needs: the workspace starts with the needed steps' output files under in/<step>/"),
  retry: RetryPolicy.optional(),
  timeout: durationMs({ min: 100, max: MAX_TIMEOUT_MS }).optional(),
  queueTimeout: durationMs({ min: 100, max: MAX_TIMEOUT_MS }).optional(),
  pool: PoolName.optional(),
  priority: Priority.optional(),
});
export type WorkflowStep = z.infer<typeof WorkflowStep>;

export const WorkflowDefinition = z
  .strictObject({
    v: z.literal(PROTOCOL_VERSION).default(PROTOCOL_VERSION),
    name: z.string().regex(TOKEN_PATTERN, "a workflow name is 1-64 letters, digits, '-' or '_'"),
    description: z.string().max(1024).optional(),
    limits: ChainLimits.default(DEFAULT_CHAIN_LIMITS).describe("guards on handoff chains inside the workflow, and its deadline"),
    steps: z.array(WorkflowStep).min(1).max(100),
    output: z.json().optional().describe("the run's output (templates allowed); default: the last step's output"),
  })
  .superRefine((wf, ctx) => {
    for (const issue of checkWorkflow(wf)) ctx.addIssue({ code: "custom", path: issue.path, message: issue.message });
  });
export type WorkflowDefinition = z.infer<typeof WorkflowDefinition>;
export type WorkflowDefinitionInput = z.input<typeof WorkflowDefinition>;

interface PathIssue {
  path: (string | number)[];
  message: string;
}

/**
 * What `needs` and templates get wrong: an unknown or repeated step, a cycle, a reference to a
 * step that is not upstream, `item` outside a fan-out, a template that does not parse.
 */
function checkWorkflow(wf: { steps: WorkflowStep[]; output?: unknown }): PathIssue[] {
  const issues: PathIssue[] = [];
  const index = new Map<string, number>();
  for (const [i, step] of wf.steps.entries()) {
    if (index.has(step.name)) issues.push({ path: ["steps", i, "name"], message: `another step is also named ${step.name}` });
    else index.set(step.name, i);
  }
  for (const [i, step] of wf.steps.entries()) {
    if ((step.agent === undefined) === (step.approval === undefined)) {
      issues.push({ path: ["steps", i], message: "a step runs an agent or waits for an approval: give one of agent and approval" });
    }
    if (step.approval && step.forEach !== undefined) {
      issues.push({ path: ["steps", i, "forEach"], message: "an approval step is one decision: it cannot fan out" });
    }
    for (const [j, need] of step.needs.entries()) {
      if (!index.has(need)) issues.push({ path: ["steps", i, "needs", j], message: `no step named ${JSON.stringify(need)}` });
      if (need === step.name) issues.push({ path: ["steps", i, "needs", j], message: "a step cannot need itself" });
    }
  }
  if (issues.length > 0) return issues;
  const cycle = findCycle(wf.steps);
  if (cycle) {
    const at = index.get(cycle[0] as string) as number;
    return [{ path: ["steps", at, "needs"], message: `needs form a cycle: ${cycle.join(" → ")}` }];
  }
  const upstream = upstreamOf(wf.steps);
  for (const [i, step] of wf.steps.entries()) {
    const where: [unknown, (string | number)[]][] = [
      [step.input, ["steps", i, "input"]],
      [step.forEach, ["steps", i, "forEach"]],
      [step.if, ["steps", i, "if"]],
    ];
    const fanOut = step.forEach !== undefined;
    for (const [value, base] of where) {
      for (const [text, path] of stringsIn(value, base)) {
        checkTemplates(text, path, issues, (ref) => {
          if (ref[0] === "item" || ref[0] === "index") {
            return fanOut && path[2] === "input" ? undefined : `{{ ${ref[0]} }} is only defined in the input of a step with forEach`;
          }
          if (ref[0] === "steps" && typeof ref[1] === "string" && !upstream.get(step.name)?.has(ref[1])) {
            return index.has(ref[1])
              ? `step ${ref[1]} is not among the steps ${step.name} needs (directly or not): add it to needs`
              : `no step named ${JSON.stringify(ref[1])}`;
          }
          return undefined;
        });
      }
    }
  }
  for (const [text, path] of stringsIn(wf.output, ["output"])) {
    checkTemplates(text, path, issues, (ref) =>
      ref[0] === "steps" && typeof ref[1] === "string" && !index.has(ref[1]) ? `no step named ${JSON.stringify(ref[1])}` : undefined,
    );
  }
  return issues;
}

const ROOTS = new Set(["input", "steps", "item", "index"]);
const STEP_FIELDS = new Set(["output", "summary", "state"]);

function checkTemplates(text: string, path: (string | number)[], issues: PathIssue[], check: (ref: Reference) => string | undefined): void {
  try {
    for (const expr of expressionsIn(text)) {
      const ref = expr.ref;
      const problem = !ROOTS.has(String(ref[0]))
        ? `{{ ${formatReference(ref)} }}: a reference starts with input, steps, item or index`
        : ref[0] === "steps" && (typeof ref[1] !== "string" || !STEP_FIELDS.has(String(ref[2])))
          ? `{{ ${formatReference(ref)} }}: write steps.<name>.output, .summary or .state`
          : check(ref);
      if (problem) issues.push({ path, message: problem });
    }
  } catch (err) {
    if (!(err instanceof TemplateError)) throw err;
    issues.push({ path, message: err.message });
  }
}

/** A cycle among `needs` as step names (first repeated at the end), if there is one. */
function findCycle(steps: readonly WorkflowStep[]): string[] | undefined {
  const needs = new Map(steps.map((s) => [s.name, s.needs]));
  const state = new Map<string, "visiting" | "done">();
  const stack: string[] = [];
  const visit = (name: string): string[] | undefined => {
    if (state.get(name) === "done") return undefined;
    if (state.get(name) === "visiting") return [...stack.slice(stack.indexOf(name)), name];
    state.set(name, "visiting");
    stack.push(name);
    for (const need of needs.get(name) ?? []) {
      const cycle = visit(need);
      if (cycle) return cycle;
    }
    stack.pop();
    state.set(name, "done");
    return undefined;
  };
  for (const step of steps) {
    const cycle = visit(step.name);
    if (cycle) return cycle;
  }
  return undefined;
}

/** Every step's transitive `needs`. */
function upstreamOf(steps: readonly WorkflowStep[]): Map<string, Set<string>> {
  const needs = new Map(steps.map((s) => [s.name, s.needs]));
  const memo = new Map<string, Set<string>>();
  const of = (name: string): Set<string> => {
    const known = memo.get(name);
    if (known) return known;
    const all = new Set<string>();
    memo.set(name, all);
    for (const need of needs.get(name) ?? []) {
      all.add(need);
      for (const n of of(need)) all.add(n);
    }
    return all;
  };
  for (const step of steps) of(step.name);
  return memo;
}

export const RunState = z.enum(["running", "succeeded", "failed", "cancelled"]);
export type RunState = z.infer<typeof RunState>;

export const StepState = z.enum(["pending", "running", "succeeded", "failed", "skipped", "cancelled"]);
export type StepState = z.infer<typeof StepState>;

/** One job chain of a step: one per step, or one per item of a fan-out. */
export const StepInstance = z.looseObject({
  index: z.number().int().nonnegative(),
  /** `starting`: decided, its job not yet admitted (a dispatcher admits it, once, by idempotency key). */
  state: z.enum(["starting", "running", "succeeded", "failed", "cancelled"]),
  /** The chain's jobs, the first one first: a handoff adds one. */
  jobs: z.array(z.string()).default([]),
  output: z.json().optional(),
  summary: z.string().optional(),
  error: ErrorInfo.optional(),
});
export type StepInstance = z.infer<typeof StepInstance>;

/** An approval step's request and, once given, its decision. */
export const ApprovalState = z.looseObject({
  requestedAt: z.iso.datetime(),
  deadline: z.iso.datetime().describe("when it fails if nobody decided"),
  decision: z.enum(["approved", "rejected"]).optional(),
  by: z.string().optional().describe("who decided"),
  at: z.iso.datetime().optional(),
  comment: z.string().max(4096).optional(),
});
export type ApprovalState = z.infer<typeof ApprovalState>;

export const StepRun = z.looseObject({
  state: StepState,
  instances: z.array(StepInstance).default([]),
  /** An approval step's request and decision (`running` while it waits). */
  approval: ApprovalState.optional(),
  startedAt: z.iso.datetime().optional(),
  finishedAt: z.iso.datetime().optional(),
  /** Why the step was skipped, failed or cancelled. */
  reason: z.string().optional(),
});
export type StepRun = z.infer<typeof StepRun>;

/** A workflow run, in the workflows bucket under its id. Loose, like job records. */
export const WorkflowRun = z.looseObject({
  v: z.literal(PROTOCOL_VERSION),
  id: z.string(),
  workflow: WorkflowDefinition,
  input: z.json(),
  /** The user who started it; absent on older runs: `local`. */
  owner: z.string().regex(TOKEN_PATTERN).optional(),
  /** Its owner's role when it started it: its jobs count under that role's quota (absent: a submitter's). */
  role: Role.optional(),
  state: RunState,
  createdAt: z.iso.datetime(),
  finishedAt: z.iso.datetime().optional(),
  deadline: z.iso.datetime().optional(),
  steps: z.record(z.string(), StepRun),
  output: z.json().optional(),
  error: ErrorInfo.optional(),
  labels: z.record(z.string(), z.string()).default({}),
  /** The trace context of the `workflows.start` request's span, when it was traced: the run's jobs join it. */
  traceparent: Traceparent.optional(),
});
export type WorkflowRun = z.infer<typeof WorkflowRun>;

export const isRunFinal = (state: RunState): boolean => state !== "running";
