/**
 * Sessions: a sandbox that outlives one command, held by one worker for its owner, in which the
 * owner runs commands one at a time (docs/sessions.md). Callers use the dispatchers' API
 * (`sessions.*`), which check the caller against the session's owner and ask the holding worker
 * on `<prefix>.sess.<workerId>.<op>`; the worker keeps the record in the sessions bucket.
 */

import { z } from "zod";
import { AgentName, EnvName, PoolName, PROTOCOL_VERSION } from "./agent.js";
import { ErrorInfo } from "./errors.js";
import { SandboxInfo } from "./job.js";
import { TOKEN_PATTERN } from "./names.js";
import { durationMs } from "./units.js";

export const SessionId = z.string().regex(/^ses-[A-Za-z0-9_-]{1,60}$/, "a session id is ses- and letters, digits, '-' or '_'");

/** `lost`: its worker is gone (read from the worker's presence; the record still says `open`). */
export const SessionState = z.enum(["open", "closed", "lost"]);
export type SessionState = z.infer<typeof SessionState>;

const HOUR = 3_600_000;

/** Loose, like job records: an older reader ignores fields a newer writer adds. */
export const SessionRecord = z.looseObject({
  v: z.literal(PROTOCOL_VERSION),
  id: SessionId,
  owner: z.string().regex(TOKEN_PATTERN),
  agent: AgentName,
  pool: PoolName,
  workerId: z.string(),
  sandbox: SandboxInfo,
  state: SessionState,
  createdAt: z.iso.datetime(),
  /** When the last command ended (or the session opened): it closes `idleTimeoutMs` after. */
  lastUsedAt: z.iso.datetime(),
  idleTimeoutMs: z.number().int().positive(),
  /** It closes then, busy or not. */
  expiresAt: z.iso.datetime(),
  /** How many commands it has run. */
  execs: z.number().int().nonnegative(),
  closedAt: z.iso.datetime().optional(),
  /** Why it closed: `closed` (asked), `idle`, `lifetime`, `worker_stopped`. */
  reason: z.string().optional(),
});
export type SessionRecord = z.infer<typeof SessionRecord>;

export const OpenSessionRequest = z.strictObject({
  /** The agent whose runtime (sandbox, limits, network, secrets) the session's sandbox gets. */
  agent: AgentName,
  idleTimeout: durationMs({ min: 1_000, max: 24 * HOUR })
    .default(10 * 60_000)
    .describe("closed after this long without a command"),
  maxLifetime: durationMs({ min: 1_000, max: 7 * 24 * HOUR })
    .default(8 * HOUR)
    .describe("closed this long after it opened, busy or not"),
});
export type OpenSessionRequest = z.input<typeof OpenSessionRequest>;

export const SessionRef = z.strictObject({ id: SessionId });
export const SessionReply = z.strictObject({ session: SessionRecord });

/** The most of each stream an exec's reply carries (its end); all of it goes to the logs stream. */
export const MAX_EXEC_REPLY_OUTPUT = 256 * 1024;

export const ExecRequest = z.strictObject({
  id: SessionId,
  argv: z
    .array(z.string().max(16 * 1024))
    .min(1)
    .max(256),
  env: z.record(EnvName, z.string().max(16 * 1024)).default({}),
  timeout: durationMs({ min: 100, max: 24 * HOUR }).default(10 * 60_000),
});
export type ExecRequest = z.input<typeof ExecRequest>;

export const ExecReply = z.strictObject({
  /** `<session>.<n>`: its output on the logs stream carries it in the `Boxcar-Exec` header. */
  execId: z.string(),
  /** Null when it was ended by a signal. */
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  timedOut: z.boolean(),
  durationMs: z.number().nonnegative(),
  /** The end of its output (base64), at most `MAX_EXEC_REPLY_OUTPUT` bytes a stream. */
  stdout: z.base64(),
  stderr: z.base64(),
  /** More was written than these carry. */
  truncated: z.boolean(),
});
export type ExecReply = z.infer<typeof ExecReply>;

export const ListSessionsRequest = z.strictObject({
  state: SessionState.optional(),
  limit: z.number().int().min(1).max(1000).default(100),
});
export type ListSessionsRequest = z.input<typeof ListSessionsRequest>;
export const ListSessionsReply = z.strictObject({ sessions: z.array(SessionRecord) });

/** What a dispatcher asks a worker to open: the request, with the owner and the agent as applied. */
export const WorkerOpenSession = z.strictObject({
  id: SessionId,
  owner: z.string().regex(TOKEN_PATTERN),
  request: z.looseObject({ agent: AgentName, idleTimeout: z.number(), maxLifetime: z.number() }),
  /** The caller may open a host session (an admin): a host sandbox runs commands as the worker's own user. */
  mayUseHost: z.boolean(),
  /** The agent definition, as the dispatcher read it. */
  agent: z.unknown(),
});

/** A worker's answer to a dispatcher: the data, or why not. */
export const WorkerReply = z.discriminatedUnion("ok", [
  z.strictObject({ ok: z.literal(true), data: z.unknown() }),
  z.strictObject({ ok: z.literal(false), error: ErrorInfo }),
]);
