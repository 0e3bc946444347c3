import { z } from "zod";

/**
 * Stable error codes: branch on these, in any language, never on message text. What each means
 * and where it appears is in `ERROR_CODE_DOCS`.
 */
export const ErrorCode = {
  badJson: "bad_json",
  invalid: "invalid",
  tooLarge: "too_large",
  unknownAgent: "unknown_agent",
  notFound: "not_found",
  inputFileMissing: "input_file_missing",
  conflict: "conflict",
  agentFailed: "agent_failed",
  rateLimited: "rate_limited",
  badResult: "bad_result",
  timedOut: "timed_out",
  expired: "expired",
  cancelled: "cancelled",
  noSandbox: "no_sandbox",
  sandboxFailed: "sandbox_failed",
  imageUnavailable: "image_unavailable",
  oomKilled: "oom_killed",
  missingSecret: "missing_secret",
  workerStopped: "worker_stopped",
  sessionLost: "session_lost",
  maxSteps: "max_steps",
  maxTokens: "max_tokens",
  doomLoop: "doom_loop",
  handoffRefused: "handoff_refused",
  workflowFailed: "workflow_failed",
  forbidden: "forbidden",
  policyDenied: "policy_denied",
  quotaExceeded: "quota_exceeded",
  storageQuotaExceeded: "storage_quota_exceeded",
  budgetExceeded: "budget_exceeded",
  queueFull: "queue_full",
  storageFull: "storage_full",
  acceptedPending: "accepted_pending",
  unavailable: "unavailable",
  internal: "internal",
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

/**
 * The HTTP-like status of an API error reply with each code, in its `Nats-Service-Error-Code`
 * header (the body carries the code itself). A code not listed here is not one an API request is
 * refused with; a reply that carries one anyway gets 500, as `internal` does.
 */
export const ERROR_STATUS: Readonly<Partial<Record<ErrorCode, number>>> = {
  bad_json: 400,
  invalid: 400,
  too_large: 413,
  unknown_agent: 404,
  not_found: 404,
  input_file_missing: 404,
  conflict: 409,
  forbidden: 403,
  policy_denied: 403,
  quota_exceeded: 429,
  storage_quota_exceeded: 507,
  budget_exceeded: 402,
  queue_full: 503,
  storage_full: 507,
  accepted_pending: 202,
  handoff_refused: 422,
  no_sandbox: 422,
  unavailable: 503,
  internal: 500,
};

/**
 * What each code means and where a client meets it, in the order of docs/nats-api.md's table of
 * them (`pnpm docs:tables` writes it from this; a code missing here does not compile).
 */
export const ERROR_CODE_DOCS: Readonly<Record<ErrorCode, { readonly meaning: string; readonly appears: string }>> = {
  bad_json: { meaning: "the message is not JSON", appears: "API replies; `rejected` records" },
  invalid: {
    meaning:
      "the message does not match its schema (`issues` names the fields), its subject has the wrong shape, or a work item lacks a trusted signature",
    appears: "API replies; `rejected` records; `work_rejected` worker events",
  },
  too_large: {
    meaning: "the message or an input is over a size limit (a request or submission over 256 KiB; more than 1000 artifacts)",
    appears: "API replies; `rejected` and `failed` records",
  },
  unknown_agent: { meaning: "the job names an agent that is not applied", appears: "API replies; `rejected` records" },
  not_found: {
    meaning: "no job, agent or workflow run with that id or name; for a submitter, also another user's job or run",
    appears: "API replies",
  },
  input_file_missing: {
    meaning: "an input file reference names no object in the Object Store",
    appears: "API replies; `rejected` records; `failed` records if the object went away before the run",
  },
  conflict: { meaning: "the job's state does not allow the request (cancel of a finished job)", appears: "API replies" },
  forbidden: {
    meaning: "the caller's role may not call this endpoint (`ROLE_ENDPOINTS` in `access.ts`), or may not name that pool or input file",
    appears: "API replies",
  },
  policy_denied: {
    meaning:
      "the agent asks for more than the system policy (at apply and submission) or the worker's own policy (before a run) allows; `issues` names the fields",
    appears: "API replies; `failed` records and events",
  },
  budget_exceeded: {
    meaning: "the job's agent or user has spent its budget for the day (the system policy's `budgets`)",
    appears: "`jobs.submit` and `workflows.start` replies, `rejected` records of intake submissions; `cancelled` jobs stopped by a budget",
  },
  quota_exceeded: {
    meaning: "the job's owner has as many jobs queued (or running) as its quota allows",
    appears: "API replies; `rejected` records of intake submissions and schedule ticks; a refused handoff's or workflow step's error",
  },
  storage_quota_exceeded: {
    meaning:
      "the job's owner keeps as many bytes of job records and artifacts as its quota allows (the system policy's `quotas.*.bytes`), or the whole system as many bytes of artifacts as `quotas.artifacts` allows; nothing was kept: submit again once retention or `boxcar clean` has deleted some (exit code 3)",
    appears:
      "API replies (`jobs.submit`, `workflows.start`, `jobs.retry`, `jobs.rerun`); `rejected` records of intake submissions and schedule ticks; a refused handoff's or workflow step's error",
  },
  queue_full: {
    meaning:
      "the whole system has as many jobs (or bytes of job records) waiting to start as the system policy's `queue` limits allow (default 100000 jobs, 256 MiB); nothing was kept, submit again later (exit code 3)",
    appears: "API replies (`jobs.submit`, `workflows.start`); an intake submission waits in its stream instead",
  },
  storage_full: {
    meaning:
      "JetStream has no room, and nothing was kept: a submit when its store (the server's `max_file_store` or the account's limit) is full, or has less free than the headroom the system policy keeps for the jobs admitted (`queue.headroom`); or a role that creates the system on a server with less storage free than its streams reserve, refused before it made any, with sizes that fit (exit code 3); or a job whose artifacts its worker waited to store for its `roomWait` (default 10 minutes) while the store stayed full",
    appears:
      "API replies (`jobs.submit`, `workflows.start`); an intake submission waits in its stream instead; a role's refusal to start; a failed job's `error`",
  },
  accepted_pending: {
    meaning:
      "the store filled while the job was admitted and its record could not be taken back: the job is kept, `queued`, and runs once space frees (the message names it). Not a refusal: do not submit it again without its idempotency key (with it, a resubmission returns this job)",
    appears: "API replies (`jobs.submit`)",
  },
  handoff_refused: {
    meaning:
      "a handoff was not made: the target is not among the agent's `handoffs`, a chain limit was hit, the run ended, or the next job could not be admitted",
    appears: "the record's `handoff.error`; `handoff_refused` events",
  },
  workflow_failed: {
    meaning: "a workflow step failed, the run passed its deadline, or its output could not be rendered",
    appears: "the run's `error`; `failed` workflow events",
  },
  expired: {
    meaning: "the job was not started within its queue timeout (`expiresAt`)",
    appears: "`expired` records and events",
  },
  agent_failed: {
    meaning: "the agent exited non-zero, reported an error in its result file, or its command could not be started",
    appears: "`failed` records and events",
  },
  rate_limited: {
    meaning: "the agent reported that its provider refused it for its rate limit (`rateLimited` in its result file)",
    appears: "`failed` records and events, and a retried attempt's history",
  },
  bad_result: { meaning: "the agent wrote a result file that is not valid", appears: "`failed` records and events" },
  timed_out: { meaning: "the run went past its timeout and was killed", appears: "`timed_out` records and events" },
  cancelled: { meaning: "the job was cancelled", appears: "`cancelled` records and events" },
  no_sandbox: {
    meaning:
      "no sandbox the worker can offer (or no live worker of the pool) satisfies the agent's runtime wishes and trust; the message says what to change",
    appears: "API replies (no live worker can run it); records and events of the job",
  },
  image_unavailable: {
    meaning: "the container image (or E2B template) is not there and cannot be pulled; the message names it",
    appears: "records and events of the job",
  },
  oom_killed: { meaning: "the agent used more memory than its limit and was killed", appears: "`failed` records and events" },
  sandbox_failed: { meaning: "the sandbox could not be created or failed", appears: "records and events; sandbox events" },
  missing_secret: { meaning: "a secret the agent needs is not in the worker's environment", appears: "records and events of the job" },
  worker_stopped: { meaning: "the worker stopped while the job ran and handed it back", appears: "job events" },
  max_steps: {
    meaning: "a prompt agent's loop made its `maxSteps` model calls without finishing (docs/harness.md#guards)",
    appears: "`failed` records and events of prompt agents' jobs",
  },
  max_tokens: {
    meaning: "a prompt agent's loop used its `maxTokens` (in and out, over the job) without finishing (docs/harness.md#guards)",
    appears: "`failed` records and events of prompt agents' jobs",
  },
  doom_loop: {
    meaning:
      "a prompt agent's model asked for the same tool call with the same arguments too many times in a row, after it was told (docs/harness.md#guards)",
    appears: "`failed` records and events of prompt agents' jobs",
  },
  session_lost: {
    meaning: "the session a job was to run in (`submit --session`) closed, or its worker is gone, before or while the job ran",
    appears: "`failed` records and events of jobs in a session",
  },
  unavailable: {
    meaning:
      "no dispatcher answered or NATS is unreachable (set by clients), or JetStream did not answer the dispatcher in time, say while a cluster elects leaders (sent by dispatchers): try again",
    appears: "API replies; client libraries, the CLI",
  },
  internal: { meaning: "anything else; the dispatcher logs it", appears: "anywhere" },
};

export const ErrorIssue = z.strictObject({ path: z.string(), message: z.string() });
export type ErrorIssue = z.infer<typeof ErrorIssue>;

/** An error as it travels in replies, records and events. */
export const ErrorInfo = z.strictObject({
  code: z.string(),
  message: z.string(),
  issues: z.array(ErrorIssue).optional(),
});
export type ErrorInfo = z.infer<typeof ErrorInfo>;

/** Marks a BoxcarError, whichever copy of this package made it. */
const BRAND = Symbol.for("boxcar.BoxcarError");

/** Base of every Boxcar error: a stable `code` plus the field paths at fault, if any. */
export class BoxcarError extends Error {
  override readonly name: string = "BoxcarError";
  readonly code: ErrorCode;
  readonly issues: readonly ErrorIssue[];

  constructor(code: ErrorCode, message: string, options: { issues?: readonly ErrorIssue[]; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.code = code;
    this.issues = options.issues ?? [];
  }

  /**
   * `instanceof BoxcarError` holds for a BoxcarError of another copy of this package too: the
   * bundled CLI has its own, and the role packages it loads theirs. A subclass checks as usual
   * (another copy's `ValidationError` is not this copy's).
   */
  static override [Symbol.hasInstance](value: unknown): boolean {
    // biome-ignore lint/complexity/noThisInStatic: `this` is the class asked about, a subclass's included.
    if (this !== BoxcarError) return Function.prototype[Symbol.hasInstance].call(this, value);
    return typeof value === "object" && value !== null && (value as { [BRAND]?: unknown })[BRAND] === true;
  }

  toInfo(): ErrorInfo {
    return this.issues.length > 0
      ? { code: this.code, message: this.message, issues: [...this.issues] }
      : { code: this.code, message: this.message };
  }

  static fromInfo(info: ErrorInfo): BoxcarError {
    return new BoxcarError(info.code as ErrorCode, info.message, { issues: info.issues ?? [] });
  }
}

// On the prototype: every BoxcarError has it, and it is no field of one (nor shown by inspect).
Object.defineProperty(BoxcarError.prototype, BRAND, { value: true });

/**
 * The same error with each issue's path put under `field`, the field of the request the checked
 * value came from: an issue's path is always relative to the request body (docs/nats-api.md).
 */
export function issuesUnder(err: unknown, field: string): unknown {
  if (!(err instanceof BoxcarError) || err.issues.length === 0) return err;
  const issues = err.issues.map((issue) => ({
    ...issue,
    path: issue.path === "" ? field : `${field}${issue.path.startsWith("[") ? "" : "."}${issue.path}`,
  }));
  return new BoxcarError(err.code, err.message, { issues, cause: err.cause });
}

/** Input that does not match its schema. */
export class ValidationError extends BoxcarError {
  override readonly name = "ValidationError";
  constructor(what: string, issues: readonly ErrorIssue[]) {
    super(ErrorCode.invalid, `${what}: ${issues.map((i) => (i.path ? `${i.path}: ${i.message}` : i.message)).join("; ")}`, { issues });
  }
}

/** Renders zod issues as `a.b[2].c` paths. */
export function zodIssues(error: z.ZodError): ErrorIssue[] {
  return error.issues.map((issue) => ({ path: formatPath(issue.path), message: issue.message }));
}

export function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const seg of path) {
    if (typeof seg === "number") out += `[${seg}]`;
    else out += out ? `.${String(seg)}` : String(seg);
  }
  return out;
}

/** Parses `value` with `schema`, throwing a {@link ValidationError} that names each bad field. */
export function parseWith<S extends z.ZodType>(schema: S, value: unknown, what: string): z.infer<S> {
  const r = schema.safeParse(value);
  if (!r.success) throw new ValidationError(what, zodIssues(r.error));
  return r.data;
}

/** Decodes a JSON message body and validates it; errors carry `bad_json`, `too_large` or `invalid`. */
export function decodeMessage<S extends z.ZodType>(
  schema: S,
  data: Uint8Array,
  what: string,
  maxBytes = Number.POSITIVE_INFINITY,
): z.infer<S> {
  if (data.byteLength > maxBytes) {
    throw new BoxcarError(ErrorCode.tooLarge, `${what} is ${data.byteLength} bytes; the limit is ${maxBytes}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder().decode(data));
  } catch (cause) {
    throw new BoxcarError(ErrorCode.badJson, `${what} is not valid JSON: ${(cause as Error).message}`, { cause });
  }
  return parseWith(schema, json, what);
}

export function toErrorInfo(err: unknown): ErrorInfo {
  if (err instanceof BoxcarError) return err.toInfo();
  return { code: ErrorCode.internal, message: err instanceof Error ? err.message : String(err) };
}
