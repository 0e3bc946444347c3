import { z } from "zod";

/** Stable error codes: branch on these, in any language, never on message text. */
export const ErrorCode = {
  /** The message is not JSON. */
  badJson: "bad_json",
  /** The message does not match the schema; `issues` names the fields. */
  invalid: "invalid",
  /** The message or an input exceeds a size limit. */
  tooLarge: "too_large",
  unknownAgent: "unknown_agent",
  notFound: "not_found",
  /** An input file reference names no object in the Object Store. */
  inputFileMissing: "input_file_missing",
  /** The job is in a state that does not allow the request (e.g. cancel of a finished job). */
  conflict: "conflict",
  /** The agent exited non-zero or reported an error. */
  agentFailed: "agent_failed",
  /** The agent wrote a result file that is not valid. */
  badResult: "bad_result",
  timedOut: "timed_out",
  /** The job was not started within its queue timeout. */
  expired: "expired",
  cancelled: "cancelled",
  /** No sandbox this worker can offer satisfies the agent's runtime wishes. */
  noSandbox: "no_sandbox",
  sandboxFailed: "sandbox_failed",
  /** The sandbox image (or template) is not present and cannot be pulled. */
  imageUnavailable: "image_unavailable",
  /** The agent used more memory than its limit and was killed. */
  oomKilled: "oom_killed",
  /** A secret the agent needs is not in the worker's environment. */
  missingSecret: "missing_secret",
  /** The worker stopped while the job ran and handed it back. */
  workerStopped: "worker_stopped",
  /** A handoff was not made: the target is not among the agent's handoffs, or a chain limit was hit. */
  handoffRefused: "handoff_refused",
  /** A workflow step failed, or the run hit its deadline. */
  workflowFailed: "workflow_failed",
  /** The caller's role may not make this request. */
  forbidden: "forbidden",
  /** The agent asks for more than an admin's (or the worker's) policy allows; `issues` names the fields. */
  policyDenied: "policy_denied",
  /** The caller has as many jobs queued or running as its quota allows. */
  quotaExceeded: "quota_exceeded",
  /** The system has as many jobs (or bytes of them) queued as its policy's `queue` limits allow; retry later. */
  queueFull: "queue_full",
  /** JetStream has no room for it: the server's or account's storage is used up, or smaller than the streams ask for. */
  storageFull: "storage_full",
  /** No dispatcher answered, or NATS is unreachable. */
  unavailable: "unavailable",
  internal: "internal",
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

export const ErrorIssue = z.strictObject({ path: z.string(), message: z.string() });
export type ErrorIssue = z.infer<typeof ErrorIssue>;

/** An error as it travels in replies, records and events. */
export const ErrorInfo = z.strictObject({
  code: z.string(),
  message: z.string(),
  issues: z.array(ErrorIssue).optional(),
});
export type ErrorInfo = z.infer<typeof ErrorInfo>;

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

  toInfo(): ErrorInfo {
    return this.issues.length > 0
      ? { code: this.code, message: this.message, issues: [...this.issues] }
      : { code: this.code, message: this.message };
  }

  static fromInfo(info: ErrorInfo): BoxcarError {
    return new BoxcarError(info.code as ErrorCode, info.message, { issues: info.issues ?? [] });
  }
}

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
