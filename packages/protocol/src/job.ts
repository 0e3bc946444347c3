import { z } from "zod";
import { AgentDefinition, AgentName, MAX_TIMEOUT_MS, PoolName, PROTOCOL_VERSION, RetryPolicy } from "./agent.js";
import { ErrorInfo } from "./errors.js";
import { TOKEN_PATTERN } from "./names.js";
import { Role } from "./principal.js";
import { Priority } from "./priority.js";
import { SessionId } from "./session-id.js";
import { Traceparent } from "./trace-context.js";
import { durationMs } from "./units.js";
import { Usage } from "./usage.js";
import { ChainLimits, ChainLink, HandoffDecision, HandoffRequest } from "./workflow.js";

/** The largest job spec accepted inline; files travel through the Object Store (claim-check). */
export const MAX_SPEC_BYTES = 256 * 1024;
export const MAX_INPUT_FILES = 1000;

/** A path inside the workspace: relative, no `..`, no empty or hidden-control segments. */
export const WorkspacePath = z
  .string()
  .min(1)
  .max(512)
  .refine(
    (p) => !p.startsWith("/") && p.split("/").every((s) => s !== "" && s !== "." && s !== "..") && !p.startsWith(".boxcar/"),
    "must be a relative path without '.', '..', empty segments or the reserved .boxcar/ folder",
  );

/** A file the submitter put in the Object Store beforehand; the job carries only the reference. */
export const InputFileRef = z.strictObject({
  path: WorkspacePath.describe("where the file appears in the agent's workspace"),
  object: z.string().min(1).max(1024).describe("name of the object in the artifacts Object Store"),
});
export type InputFileRef = z.infer<typeof InputFileRef>;

/** Where `owner`'s uploaded input files are kept in the artifacts Object Store. */
export const inputObjectPrefix = (owner: string): string => `inputs/${owner}/`;

/** How far ahead a job may be delayed (`runAt`, `delay`). */
export const MAX_DELAY_MS = 30 * 24 * 3_600_000;

export const JobSpec = z
  .strictObject({
    v: z.literal(PROTOCOL_VERSION).default(PROTOCOL_VERSION).describe("protocol version"),
    agent: AgentName.describe("the agent to run"),
    input: z.json().default(null).describe("the job's input; the agent reads it from `.boxcar/input.json` ($BOXCAR_INPUT_FILE)"),
    files: z.array(InputFileRef).max(MAX_INPUT_FILES).default([]).describe("files from the Object Store to put in the workspace"),
    idempotencyKey: z.string().min(1).max(256).optional().describe("the owner's second submission with this key returns the first job"),
    timeout: durationMs({ min: 100, max: MAX_TIMEOUT_MS }).optional().describe("run-time limit of this job"),
    queueTimeout: durationMs({ min: 100, max: MAX_TIMEOUT_MS })
      .optional()
      .describe("not started this long after it was queued, the job ends `expired`"),
    deadline: durationMs({ min: 1_000, max: MAX_TIMEOUT_MS })
      .optional()
      .describe("overall limit from submission across all attempts: no attempt runs or is retried past it"),
    pool: PoolName.optional().describe("the work pool to run in"),
    priority: Priority.optional().describe("priority within the pool"),
    retry: RetryPolicy.optional().describe("how failed attempts are retried"),
    labels: z.record(z.string().max(64), z.string().max(256)).default({}).describe("free-form labels, stored in the record's `spec`"),
    chainLimits: ChainLimits.optional().describe("guards on the handoff chain this job starts"),
    session: SessionId.optional().describe(
      "run in this open session's sandbox: one of the owner's, of this agent or with an agent that allows sessions",
    ),
    runAt: z.iso.datetime({ offset: true }).optional().describe("not started before this time (ISO 8601); at most 30 days ahead"),
    delay: durationMs({ min: 0, max: MAX_DELAY_MS }).optional().describe("not started before this long after it was submitted"),
  })
  .refine((spec) => spec.runAt === undefined || spec.delay === undefined, {
    message: "give runAt or delay, not both",
    path: ["delay"],
  });
/** A job spec after validation (defaults filled, durations in ms). */
export type JobSpec = z.infer<typeof JobSpec>;
/** A job spec as a client writes it. */
export type JobSpecInput = z.input<typeof JobSpec>;

/** States a job passes through, and the final ones: one list each, so the two cannot drift. */
const ACTIVE_STATES = ["accepted", "queued", "running"] as const;
const FINAL_STATES = ["succeeded", "failed", "timed_out", "cancelled", "rejected", "dead", "expired"] as const;

export const JobState = z.enum([...ACTIVE_STATES, ...FINAL_STATES]);
export type JobState = z.infer<typeof JobState>;

export const TERMINAL_STATES: ReadonlySet<JobState> = new Set(FINAL_STATES);

/** What each state means, for docs/nats-api.md's table of them (`pnpm docs:tables`). */
export const JOB_STATE_DOCS: Readonly<Record<JobState, string>> = {
  accepted: "written by older dispatchers before the work item; new records start `queued`",
  queued: "waiting for a worker of its pool",
  running: "claimed by a worker",
  succeeded: "the agent finished without error",
  failed: "see `error.code`",
  timed_out: "killed at its timeout",
  cancelled: "cancelled before or during its run",
  rejected: "a submission on the intake stream that could not be admitted; `error` says why",
  dead: "every attempt its retry policy allows failed; `history` has them",
  expired: "not started before `expiresAt` (its queue timeout)",
};

/** One ended attempt, kept on the record when the job is retried. */
export const AttemptOutcome = z.strictObject({
  attempt: z.number().int().positive(),
  state: z.enum(["failed", "timed_out", "cancelled"]).describe("cancelled: an attempt cancelled, then retried (`jobs.retry`)"),
  workerId: z.string().optional(),
  finishedAt: z.iso.datetime(),
  error: ErrorInfo.optional(),
});
export type AttemptOutcome = z.infer<typeof AttemptOutcome>;
export const isTerminal = (state: JobState): boolean => TERMINAL_STATES.has(state);

/** The most signals a job keeps for when it starts, and the most payload they hold in all (JSON bytes). */
export const MAX_KEPT_SIGNALS = 16;
export const MAX_KEPT_SIGNAL_BYTES = 64 * 1024;

/** How a pool's concurrency limit is named among a job's places: `=` is in no agent's name. */
export const POOL_PLACE_PREFIX = "=pool.";

/** The limits a job takes places under, in order (`places`, or its `place` alone). */
export function placesOf(concurrency: { place: string; places?: string[] }): string[] {
  return concurrency.places ?? [concurrency.place];
}

/** How an agent's limit over all the values of its key (`total`) is named among a job's places: `<agent>.=total`. */
export const TOTAL_PLACE = "=total";

/** Which limit a job waiting at `place` waits for, in words. */
export function limitNamed({ place }: { place: string }): string {
  if (place.startsWith(POOL_PLACE_PREFIX)) return `pool ${place.slice(POOL_PLACE_PREFIX.length)}'s concurrency limit`;
  return place.endsWith(`.${TOTAL_PLACE}`) ? "its agent's concurrency limit over all keys" : "its agent's concurrency limit";
}

export const Artifact = z.strictObject({
  path: z.string(),
  object: z.string(),
  size: z.number().int().nonnegative(),
  sha256: z.string(),
});
export type Artifact = z.infer<typeof Artifact>;

/** What the agent wrote to $BOXCAR_RESULT_FILE. Every field is optional. */
export const AgentResultFile = z.looseObject({
  output: z.json().optional().describe("the job's result, any JSON"),
  summary: z.string().max(4096).optional().describe("one line for people"),
  error: z.string().max(4096).optional().describe("set to report failure even with exit code 0"),
  retry: z.boolean().optional().describe("false: this failure must not be retried"),
  rateLimited: z
    .looseObject({
      retryAfter: z
        .number()
        .min(0)
        .default(0)
        .describe("seconds the provider asked to wait (its `Retry-After`; none: 0); more than 3 600 counts as 3 600"),
    })
    .optional()
    .describe(
      "the agent's provider refused it for its rate limit (a 429): the attempt fails `rate_limited`, is retried no sooner (per the retry policy), and the agent's rate limit for the job's key pauses as long",
    ),
  handoff: HandoffRequest.optional().describe("pass the work on to another agent (one of this agent's handoffs)"),
});
export type AgentResultFile = z.infer<typeof AgentResultFile>;

/** What the agent's run used, where the sandbox can measure it (Docker can; the host cannot). */
export const ResourceUsage = z.strictObject({
  cpuMs: z.number().nonnegative().optional(),
  memoryPeakBytes: z.number().int().nonnegative().optional(),
  pidsPeak: z.number().int().nonnegative().optional(),
});
export type ResourceUsage = z.infer<typeof ResourceUsage>;

/** Loose, like the record that holds it: an older reader ignores fields a newer worker adds. */
export const JobResult = z.looseObject({
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  output: z.json().nullable(),
  summary: z.string().optional(),
  durationMs: z.number().nonnegative(),
  /** True when the agent was killed for using more memory than its limit. */
  oomKilled: z.boolean().optional(),
  usage: ResourceUsage.optional(),
  /** The agent asked to hand the work on; the record's `handoff` says what came of it. */
  handoff: HandoffRequest.optional(),
});
export type JobResult = z.infer<typeof JobResult>;

export const SandboxInfo = z.strictObject({
  kind: z.enum(["host", "docker", "e2b"]),
  id: z.string(),
  reason: z.string().describe("why the resolver chose this sandbox"),
});
export type SandboxInfo = z.infer<typeof SandboxInfo>;

/** Loose: a reader ignores fields a newer writer added, so old and new workers can coexist. */
export const JobRecord = z.looseObject({
  v: z.literal(PROTOCOL_VERSION).describe("protocol version"),
  id: z.string().describe("job id"),
  agent: AgentName.describe("agent name"),
  pool: PoolName.describe("the pool the job was queued in"),
  owner: z
    .string()
    .regex(TOKEN_PATTERN)
    .optional()
    .describe(
      "the user the job belongs to: who submitted it; a handoff's or workflow step's job belongs to its chain's or run's owner; absent on records from before owners (`local`)",
    ),
  role: Role.optional().describe(
    "its owner's role when it was admitted: a job it leads to (a handoff, a retry) counts under that role's quota; absent: a submitter's",
  ),
  priority: Priority.optional().describe("the priority it was queued with; absent on records from before priorities (`normal`)"),
  state: JobState.describe("the job's state"),
  spec: JobSpec.optional().describe("the validated spec; absent on `rejected` records (the spec is not kept, valid or not)"),
  attempt: z.number().int().nonnegative().describe("0 at admission; set by the worker that runs it"),
  workerId: z.string().optional().describe("the worker that claimed the job"),
  sandbox: SandboxInfo.optional().describe(
    "the sandbox it runs in: `kind` is `host`, `docker` or `e2b`; `reason` says why the worker chose it",
  ),
  createdAt: z.iso.datetime().describe("when it was admitted"),
  queuedAt: z.iso.datetime().optional().describe("when its work item was published"),
  startedAt: z.iso.datetime().optional().describe("when a worker claimed it"),
  finishedAt: z.iso.datetime().optional().describe("when it reached a final state"),
  cancelRequested: z.boolean().optional().describe("a cancel was asked for while it ran"),
  takeover: z
    .strictObject({
      attempt: z.number().int().positive().describe("the attempt it took over, which never ended"),
      workerId: z.string().optional().describe("that attempt's worker"),
      sandbox: z.string().optional().describe("that attempt's sandbox"),
      stopped: z
        .enum(["lease", "removed"])
        .describe(
          "how that attempt's agent is known to be gone: `lease`, its lease lapsed before this attempt was delivered (its lifeline or E2B timeout stopped it by then); `removed`, its sandbox was also found and removed before this attempt's agent started",
        ),
    })
    .optional()
    .describe("set when this attempt took over one whose worker died, froze or lost NATS (docs/reliability.md#one-attempt-alive)"),
  attemptsAllowed: z
    .number()
    .int()
    .positive()
    .optional()
    .describe("attempts up to this number may be retried: the retry policy's `maxAttempts`, more after `jobs.retry`"),
  expiresAt: z.iso.datetime().optional().describe("when the job, if still queued, ends `expired` (from its `queueTimeout`)"),
  deadlineAt: z.iso.datetime().optional().describe("when the job runs out of time across all its attempts (from its `deadline`)"),
  history: z.array(AttemptOutcome).default([]).describe("the attempts that failed and were retried, oldest first"),
  result: JobResult.optional().describe(
    "how the agent's run ended: `exitCode` and `signal` are null when there was none, `output` is null without a result file",
  ),
  artifacts: z.array(Artifact).default([]).describe("one per stored file; `object` is its name in the Object Store"),
  error: ErrorInfo.optional().describe("why it did not succeed"),
  chain: ChainLink.optional().describe("the job's place in a handoff chain or workflow run"),
  handoff: HandoffDecision.optional().describe(
    "what the dispatcher made of the agent's handoff request (`result.handoff`): `{to, jobId}` (the next job) or `{to, error}` (refused, code `handoff_refused`)",
  ),
  runAt: z.iso
    .datetime()
    .optional()
    .describe(
      "while it waits for its time (from the spec's `runAt` or `delay`, or its agent's rate limit): when its work item is published; absent once it is",
    ),
  rateLimited: z.literal(true).optional().describe("its `runAt` is the turn its agent's rate limit gave it"),
  providerLimitedUntil: z.iso
    .datetime()
    .optional()
    .describe(
      "its last attempt reported its provider's rate limit (`rateLimited` in its result): until when the agent's rate limit for its key pauses",
    ),
  concurrency: z
    .strictObject({
      place: z
        .string()
        .describe(
          "the limit it waits for a place under, or (not waiting) the last it took one under: its agent's name and its key's value (a digest) or `all`, or `=pool.` and its pool's name",
        ),
      places: z
        .array(z.string())
        .min(2)
        .optional()
        .describe(
          "every limit it takes a place under, in the order it takes them (its agent's, over all keys, its pool's); absent: `place` alone",
        ),
      waiting: z.literal(true).optional().describe("it waits for a place: its work item is published once it holds one under each limit"),
    })
    .optional()
    .describe("its places under its agent's and its pool's concurrency limits (docs/flow-control.md#concurrency-limits)"),
  session: z
    .strictObject({ id: SessionId, workerId: z.string() })
    .optional()
    .describe("the session the job runs in (`spec.session`) and the worker that holds it"),
  signals: z
    .array(z.strictObject({ name: z.string(), payload: z.json(), at: z.iso.datetime() }))
    .max(MAX_KEPT_SIGNALS)
    .optional()
    .describe(
      "the signals sent to it before it started, in the order they came (at most 16, 64 KiB of payload in all): its worker writes them before its agent starts, at every attempt",
    ),
  usage: Usage.optional().describe(
    "what its attempts' calls to their providers used, as its worker's model gateway metered them or, for an agent that does not call through it, as the agent reported them (docs/flow-control.md#usage-and-budgets)",
  ),
  schedule: z
    .strictObject({ name: z.string(), tick: z.iso.datetime() })
    .optional()
    .describe("the schedule that submitted it (its owner's), and the tick it was submitted for"),
  rerunOf: z.string().optional().describe("the job this one runs again (`jobs.rerun`), its spec with the input it was given"),
  traceparent: Traceparent.optional().describe(
    "the W3C trace context of the job's admission span, when the submit carried a trace or the dispatcher has a tracer provider: the worker's attempt and the jobs it hands off to join it",
  ),
});
export type JobRecord = z.infer<typeof JobRecord>;

/** True when a job's handoff request still waits for a dispatcher's decision. */
export const handoffPending = (job: JobRecord): boolean => job.state === "succeeded" && !!job.result?.handoff && !job.handoff;

/**
 * The work item versions: 1 carries the job's input; 2 leaves it in the job record and carries
 * its digest (`inputDigest`), so a large input is stored once. A dispatcher sends 2 only while
 * every live worker says it reads 2 (`WorkerInfo.workItems`).
 */
export const WORK_ITEM_VERSION = 2 as const;

/** What a worker pulls from `<prefix>.work.<pool>`: everything needed to run, no large data. */
export const WorkItem = z
  .looseObject({
    v: z.union([z.literal(1), z.literal(WORK_ITEM_VERSION)]),
    jobId: z.string(),
    /** The job's owner: its events and output go on subjects that carry it (absent on older items: `local`). */
    owner: z.string().regex(TOKEN_PATTERN).optional(),
    agent: AgentDefinition,
    /** Version 1: the job's input. */
    input: z.json().optional(),
    /** Version 2: the SHA-256 (hex) of the job record's `spec.input` as JSON text; the worker runs that input only if it matches. */
    inputDigest: z
      .string()
      .regex(/^[0-9a-f]{64}$/)
      .optional(),
    files: z.array(InputFileRef),
    timeoutMs: z.number().int().positive(),
    /** The job's retry policy (the spec's, else the agent's); absent: no retries. */
    retry: RetryPolicy.optional(),
    /** Present for a job in a handoff chain: the agent finds the chain's history in $BOXCAR_CHAIN_FILE. */
    chain: ChainLink.optional(),
    /** Present for a job in a session: it runs in that session's sandbox on the worker that holds it. */
    session: SessionId.optional(),
  })
  .superRefine((item, ctx) => {
    if (item.v === 1 && item.input === undefined)
      ctx.addIssue({ code: "custom", path: ["input"], message: "a version 1 work item carries the input" });
    if (item.v === 2 && (item.inputDigest === undefined || item.input !== undefined))
      ctx.addIssue({ code: "custom", path: ["inputDigest"], message: "a version 2 work item carries the input's digest, not the input" });
  });
export type WorkItem = z.infer<typeof WorkItem>;
