/**
 * Sessions: a sandbox that outlives one command, held by one worker for its owner, in which the
 * owner runs commands one at a time (docs/sessions.md). Callers use the dispatchers' API
 * (`sessions.*`), which check the caller against the session's owner and ask the holding worker
 * on `<prefix>.sess.<workerId>.<op>`; the worker keeps the record in the sessions bucket.
 */

import { z } from "zod";
import { AgentName, EnvName, PoolName, PROTOCOL_VERSION } from "./agent.js";
import { ErrorInfo } from "./errors.js";
import { Artifact, SandboxInfo } from "./job.js";
import { TOKEN_PATTERN } from "./names.js";
import { SessionId } from "./session-id.js";
import { durationMs } from "./units.js";

export { SessionId };

/** `lost`: its worker is gone (read from the worker's presence; the record still says `open`). */
export const SessionState = z.enum(["open", "closed", "lost"]);
export type SessionState = z.infer<typeof SessionState>;

const HOUR = 3_600_000;

/** A session template's name (docs/sessions.md#templates). */
export const SessionTemplateName = z.string().regex(TOKEN_PATTERN, "a template name is 1-64 letters, digits, '-' or '_'");

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
  /**
   * Paused (`sessions.pause`, docs/sessions.md#pause): since when, and when it closes if it is
   * still paused then (`pause_timeout`). Its processes are held where they were; its idle clock
   * waits; its lifetime runs on. Absent once resumed.
   */
  pausedAt: z.iso.datetime().optional(),
  pauseEndsAt: z.iso.datetime().optional(),
  closedAt: z.iso.datetime().optional(),
  /** Why it closed: `closed` (asked), `idle`, `lifetime`, `pause_timeout`, `worker_stopped`. */
  reason: z.string().optional(),
  /** What its workspace started with: a snapshot, or a git repository at a commit. */
  source: z
    .union([
      z.strictObject({ snapshot: z.string() }),
      z.strictObject({ artifactsOf: z.string() }),
      z.strictObject({ git: z.strictObject({ url: z.string(), ref: z.string().optional(), commit: z.string() }) }),
    ])
    .optional(),
  /** The template (of the system policy's `sessions.templates`) whose image its container was made from. */
  template: SessionTemplateName.optional(),
});
export type SessionRecord = z.infer<typeof SessionRecord>;

/** A session template an admin allows in the system policy: a Docker image a session's container is made from. */
export const SessionTemplate = z.strictObject({
  image: z
    .string()
    .min(1)
    .max(512)
    .regex(/^\S+$/, "an image reference, with no spaces")
    .describe("the image the session's container is made from, present on the workers' engines (an admin builds or pulls it)"),
  description: z.string().max(1024).optional().describe("what it holds, for those who open sessions"),
});
export type SessionTemplate = z.infer<typeof SessionTemplate>;

export const SnapshotId = z.string().regex(/^snap-[a-z0-9]{1,60}$/, "a snapshot id is snap- and lowercase letters or digits");

/** A git repository a session's workspace is cloned from, by the worker, before anything runs in it. */
export const GitSeed = z.strictObject({
  url: z
    .string()
    .max(2048)
    .regex(
      /^(https|git):\/\/[^/@\s]+\/\S*$/,
      "an https:// or git:// URL with no user or password in it (the agent's git.credential is the one sent)",
    ),
  /** A branch or tag; default: the remote's default branch. */
  ref: z
    .string()
    .max(256)
    .regex(/^(?!-)[A-Za-z0-9._/-]+$/, "a branch or tag name")
    .optional(),
  /** How many commits of history; default: all of it. */
  depth: z.number().int().min(1).max(1_000_000).optional(),
});
export type GitSeed = z.infer<typeof GitSeed>;

export const OpenSessionRequest = z
  .strictObject({
    /** The agent whose runtime (sandbox, limits, network, secrets) the session's sandbox gets; default, with `from`: the snapshot's. */
    agent: AgentName.optional(),
    /** A snapshot of the caller's whose workspace the session starts with. */
    from: SnapshotId.optional(),
    /** A repository the workspace is cloned from (an agent's `git.hosts` only). */
    git: GitSeed.optional(),
    /** A job of the caller's whose artifacts the workspace starts with, at their paths. */
    artifactsOf: z.string().regex(TOKEN_PATTERN, "a job id").optional(),
    /** A template of the system policy's (`sessions.templates`): its image in place of the agent's, for a Docker session. */
    template: SessionTemplateName.optional(),
    idleTimeout: durationMs({ min: 1_000, max: 24 * HOUR })
      .default(10 * 60_000)
      .describe("closed after this long without a command"),
    maxLifetime: durationMs({ min: 1_000, max: 7 * 24 * HOUR })
      .default(8 * HOUR)
      .describe("closed this long after it opened, busy or not"),
  })
  .refine((r) => r.agent !== undefined || r.from !== undefined, {
    message: "name an agent, or a snapshot to open `from`",
    path: ["agent"],
  })
  .refine((r) => [r.from, r.git, r.artifactsOf].filter((x) => x !== undefined).length <= 1, {
    message: "a workspace starts from one of a snapshot (from), a repository (git) or a job's artifacts (artifactsOf)",
    path: ["from"],
  });
export type OpenSessionRequest = z.input<typeof OpenSessionRequest>;

/** A snapshot of a session's workspace: its folders and regular files, in the snapshots Object Store. */
export const SnapshotInfo = z.strictObject({
  id: SnapshotId,
  owner: z.string().regex(TOKEN_PATTERN),
  /** The agent of the session it was taken of: a session opened `from` it gets this one unless told otherwise. */
  agent: AgentName,
  session: SessionId,
  createdAt: z.iso.datetime(),
  /** The size of its archive (a tar), and the Object Store's SHA-256 of it. */
  size: z.number().int().nonnegative(),
  digest: z.string(),
});
export type SnapshotInfo = z.infer<typeof SnapshotInfo>;
export const SnapshotRef = z.strictObject({ id: SnapshotId });
export const SnapshotReply = z.strictObject({ snapshot: SnapshotInfo });
export const ListSnapshotsReply = z.strictObject({ snapshots: z.array(SnapshotInfo) });

export const SessionRef = z.strictObject({ id: SessionId });
export const SessionReply = z.strictObject({ session: SessionRecord });

/**
 * Pauses a session (docs/sessions.md#pause): every process of it held where it is (a Docker
 * session's container frozen), until `sessions.resume`, its close, or `timeout`.
 */
export const PauseRequest = z.strictObject({
  id: SessionId,
  timeout: durationMs({ min: 1_000, max: 24 * HOUR })
    .default(HOUR)
    .describe("closed (pause_timeout) if it is still paused this long after"),
});
export type PauseRequest = z.input<typeof PauseRequest>;

/** A path in a session's workspace: relative, `/`-separated; the worker refuses `..` and symlinks out. */
export const SessionPath = z.string().min(1).max(4096);

/** Base64 of at most `max` bytes. */
function inlineBytes(max: number, what: string) {
  return z.base64().max(Math.ceil(max / 3) * 4, `${what} takes at most ${max} bytes`);
}

/** The most an exec's stdin may carry. */
export const MAX_EXEC_STDIN = 256 * 1024;

/** The most of a file read or written in one request (the rest of a message's 1 MB is base64 and JSON). */
export const MAX_SESSION_FILE_BYTES = 512 * 1024;

/**
 * The largest request the dispatchers take on `sessions.files.write` and `sessions.exec` (a file
 * of `MAX_SESSION_FILE_BYTES` in base64, with its JSON); other endpoints take `MAX_SPEC_BYTES`.
 */
export const MAX_SESSION_REQUEST_BYTES = 768 * 1024;

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
  /** A folder of the workspace (relative, no `..`) to run in; default: the workspace. */
  cwd: SessionPath.optional(),
  /** What the command reads on its stdin (base64); default: nothing, stdin is closed. */
  stdin: inlineBytes(MAX_EXEC_STDIN, "stdin").optional(),
});
export type ExecRequest = z.input<typeof ExecRequest>;

export const OutputStream = z.enum(["stdout", "stderr"]);
export type OutputStream = z.infer<typeof OutputStream>;

/** A command's output kept whole in segments of this size (docs/sessions.md#whole-output). */
export const SESSION_OUTPUT_SEGMENT = 4 * 1024 * 1024;
/** The most of a stream of one command kept whole; past it its end is cut. */
export const MAX_KEPT_OUTPUT = 256 * 1024 * 1024;
/** The most `sessions.output` gives at once. */
export const MAX_OUTPUT_READ = 512 * 1024;

/** The Object Store object saying how much of each stream a session command kept (`KeptOutput`). */
export function keptOutputSizes(session: string, execId: string): string {
  return `sessions/${session}/${execId}/kept`;
}

/** The Object Store object holding segment `index` of a session command's kept output. */
export function keptOutputObject(session: string, execId: string, stream: OutputStream, index: number): string {
  return `sessions/${session}/${execId}/${stream}/${index}`;
}

/** How much of each stream a command kept whole (only a command that wrote past the live window keeps any). */
export const KeptOutput = z.partialRecord(
  OutputStream,
  z.strictObject({ bytes: z.number().int().nonnegative(), cut: z.boolean().optional() }),
);
export type KeptOutput = z.infer<typeof KeptOutput>;

export const ExecReply = z.strictObject({
  /** `<session>.<n>`: its output on the logs stream carries it in the `Boxcar-Exec` header. */
  execId: z.string(),
  /** Null when it was ended by a signal. */
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  timedOut: z.boolean(),
  /** Ended by `sessions.cancel`. */
  cancelled: z.boolean(),
  durationMs: z.number().nonnegative(),
  /** The end of its output (base64), at most `MAX_EXEC_REPLY_OUTPUT` bytes a stream. */
  stdout: z.base64(),
  stderr: z.base64(),
  /** More was written than these carry. */
  truncated: z.boolean(),
  /** It wrote past the live window (4 MiB): its whole output is kept, readable with `sessions.output`. */
  kept: KeptOutput.optional(),
});
export type ExecReply = z.infer<typeof ExecReply>;

/** A part of a command's kept output: `length` bytes (at most 512 KiB) from `offset`. */
export const OutputRequest = z.strictObject({
  id: SessionId,
  execId: z.string().min(1).max(128),
  stream: OutputStream.default("stdout"),
  offset: z.number().int().nonnegative().default(0),
  length: z.number().int().min(1).max(MAX_OUTPUT_READ).default(MAX_OUTPUT_READ),
});
export type OutputRequest = z.input<typeof OutputRequest>;
export const OutputReply = z.strictObject({
  data: z.base64(),
  offset: z.number().int().nonnegative(),
  /** The stream's whole kept size; `offset` + the data's length reaching it is the end. */
  size: z.number().int().nonnegative(),
});
export type OutputReply = z.infer<typeof OutputReply>;

/** The most processes a session runs in the background at once; and the ended ones it remembers. */
export const MAX_BACKGROUND_PROCESSES = 8;
export const MAX_ENDED_PROCESSES = 32;

/** A process started in a session's background (`sessions.start`), running or ended. */
export const ProcessInfo = z.strictObject({
  /** `<session>.<n>`, as an exec's: its output on the logs stream carries it in the `Boxcar-Exec` header. */
  execId: z.string(),
  argv: z.array(z.string()),
  startedAt: z.iso.datetime(),
  running: z.boolean(),
  /** Once it ended: as an exec's reply says. */
  exitCode: z.number().int().nullable().optional(),
  signal: z.string().nullable().optional(),
  timedOut: z.boolean().optional(),
  killed: z.boolean().optional(),
  durationMs: z.number().nonnegative().optional(),
  /** Started with `openStdin`: whether its stdin still takes input (`sessions.input`), or was closed. */
  stdin: z.enum(["open", "closed"]).optional(),
  /** A shell on a terminal (`sessions.shell`): its bytes go through its tunnel, not the session's log. */
  terminal: z.literal(true).optional(),
});
export type ProcessInfo = z.infer<typeof ProcessInfo>;

/** `sessions.start`: an exec's fields, and whether its stdin stays open for `sessions.input`. */
export const StartRequest = ExecRequest.extend({
  /** Its stdin stays open after `stdin` (if any): `sessions.input` writes to it, and closes it. Default: closed after `stdin`. */
  openStdin: z.boolean().default(false),
});
export type StartRequest = z.input<typeof StartRequest>;

export const ProcessRef = z.strictObject({ id: SessionId, execId: z.string().min(1).max(128) });

/** The most one `sessions.input` carries. */
export const MAX_PROCESS_INPUT = 128 * 1024;

/** Input for a background process started with `openStdin`: `data` written to its stdin, then its stdin closed if `close`. */
export const InputRequest = z.strictObject({
  id: SessionId,
  execId: z.string().min(1).max(128),
  data: inlineBytes(MAX_PROCESS_INPUT, "one input").default(""),
  /** Closes its stdin once `data` is written: it reads the end of its input. */
  close: z.boolean().default(false),
});
export type InputRequest = z.input<typeof InputRequest>;
export const InputReply = z.strictObject({
  process: ProcessInfo,
  /** The bytes its stdin took. */
  written: z.number().int().nonnegative(),
});
export const ProcessReply = z.strictObject({ process: ProcessInfo });
export const ProcessesReply = z.strictObject({ processes: z.array(ProcessInfo) });
export const WaitRequest = z.strictObject({
  id: SessionId,
  execId: z.string().min(1).max(128),
  timeout: durationMs({ min: 0, max: 10 * 60_000 })
    .default(30_000)
    .describe("how long to wait for it to end; past it the reply says it still runs"),
});
export type WaitRequest = z.input<typeof WaitRequest>;
/** The process, and once it ended the end of its output, as an exec's reply. */
export const WaitReply = z.strictObject({ process: ProcessInfo, result: ExecReply.optional() });
export type WaitReply = z.infer<typeof WaitReply>;

export const SessionFileRef = z.strictObject({ id: SessionId, path: SessionPath });

/**
 * The most a session's workspace may hold for a file copied into it in parts to be taken
 * (docs/sessions.md#big-files): a copy that would pass it is refused as it starts, before a byte
 * is written. It is the workspace's own default bound.
 */
export const SESSION_FILES_QUOTA = 1024 ** 3;

/** A file's SHA-256, in lowercase hex. */
export const Sha256Hex = z.string().regex(/^[0-9a-f]{64}$/, "a SHA-256 in lowercase hex (64 characters)");

/** A file to read: all of it (at most `MAX_SESSION_FILE_BYTES`), or `length` bytes of it from `offset`. */
export const ReadSessionFile = z.strictObject({
  id: SessionId,
  path: SessionPath,
  /** Reads a part from here (to the file's end, at most `length`); the reply says the file's whole size. */
  offset: z.number().int().nonnegative().optional(),
  length: z.number().int().nonnegative().max(MAX_SESSION_FILE_BYTES).optional(),
});
export type ReadSessionFile = z.input<typeof ReadSessionFile>;
export const WriteSessionFile = z
  .strictObject({
    id: SessionId,
    path: SessionPath,
    /** The file's bytes (base64), at most `MAX_SESSION_FILE_BYTES`: the whole file (it replaces what was there), or the part at `offset`. */
    data: inlineBytes(MAX_SESSION_FILE_BYTES, "a file written in one request"),
    /** Mode 0755 (else 0644, or what the file had). */
    executable: z.boolean().default(false),
    /**
     * A part of a file written in parts: 0 starts the file (replacing what was there); more adds
     * `data` to its end, which must be there already (the file holds exactly `offset` bytes, else
     * `conflict`, naming how many it holds: resume from there).
     */
    offset: z.number().int().nonnegative().max(SESSION_FILES_QUOTA).optional(),
    /** The whole file's size, with `offset`: checked against the session's quota as the copy starts; no part may pass it. */
    size: z.number().int().nonnegative().max(SESSION_FILES_QUOTA).optional(),
    /** The whole file's SHA-256, with its last part: once written, the file is checked against it (`conflict` when it differs). */
    sha256: Sha256Hex.optional(),
  })
  .refine((w) => (w.offset === undefined) === (w.size === undefined), {
    message: "a part of a file (offset) says the whole file's size (size), and only a part does",
    path: ["size"],
  });
export type WriteSessionFile = z.input<typeof WriteSessionFile>;
export const SessionFileReply = z.strictObject({
  path: z.string(),
  /** The bytes in `data`. */
  size: z.number().int().nonnegative(),
  data: z.base64(),
  /** For a part: where it starts, and the whole file's size (`offset` + `size` reaching it is the end). */
  offset: z.number().int().nonnegative().optional(),
  fileSize: z.number().int().nonnegative().optional(),
});
export const WroteSessionFile = z.strictObject({
  path: z.string(),
  /** The bytes written by this request. */
  size: z.number().int().nonnegative(),
  /** For a part: the file's size now. */
  fileSize: z.number().int().nonnegative().optional(),
  /** The file's SHA-256, when the request asked it to be checked (it was). */
  sha256: Sha256Hex.optional(),
});
/** What a path of the workspace is; with `sha256`, a file's SHA-256 too (read whole, in the session). */
export const StatSessionFile = z.strictObject({
  id: SessionId,
  path: SessionPath,
  sha256: z.boolean().default(false),
});
export type StatSessionFile = z.input<typeof StatSessionFile>;
export const SessionFileStat = z.strictObject({
  path: z.string(),
  /** A regular file, or a folder (symlinks and the rest are no file: `not_found`). */
  type: z.enum(["file", "folder"]),
  /** A file's size. */
  size: z.number().int().nonnegative().optional(),
  /** With `sha256`: its SHA-256, and whether it is executable. */
  sha256: Sha256Hex.optional(),
  executable: z.boolean().optional(),
});
export type SessionFileStat = z.infer<typeof SessionFileStat>;

/** The most watches a session keeps at once. */
export const MAX_SESSION_WATCHES = 4;

/** Watches a path of the workspace (default: all of it) for changes, each a `file_changed` event, until `sessions.unwatch`, its timeout or the session's end. */
export const WatchRequest = z.strictObject({
  id: SessionId,
  /** A folder (or file) of the workspace; default: the workspace. */
  path: SessionPath.optional(),
  timeout: durationMs({ min: 1_000, max: 24 * HOUR })
    .default(10 * 60_000)
    .describe("the watch ends after this long"),
});
export type WatchRequest = z.input<typeof WatchRequest>;
export const WatchInfo = z.strictObject({
  /** `<session>.w<n>`: its `file_changed` events carry it. */
  watchId: z.string(),
  /** The path watched (`.`: the workspace). */
  path: z.string(),
  startedAt: z.iso.datetime(),
  /** When its timeout ends it. */
  endsAt: z.iso.datetime(),
  /** How many folders it watches (each one inotify watch, walked as they come). */
  folders: z.number().int().nonnegative(),
  active: z.boolean(),
});
export type WatchInfo = z.infer<typeof WatchInfo>;
export const WatchRef = z.strictObject({ id: SessionId, watchId: z.string().min(1).max(128) });
export const WatchReply = z.strictObject({ watch: WatchInfo });
/** The most tunnels (connections to its ports) a session has open at once. */
export const MAX_SESSION_TUNNELS = 32;
/** The most bytes either end of a tunnel sends that the other has not taken (its window). */
export const TUNNEL_WINDOW = 1024 * 1024;
/** The most bytes one message of a tunnel carries. */
export const TUNNEL_CHUNK = 64 * 1024;

/** A TCP port: 1 to 65535. */
export const Port = z
  .number()
  .int("a port is a whole number from 1 to 65535")
  .min(1, "a port is a whole number from 1 to 65535")
  .max(65_535, "a port is a whole number from 1 to 65535");

/** A tunnel's id, chosen fresh by its caller for each connection: its subjects are `<prefix>.tunnel.<user>.<id>.in|out`. */
export const TunnelId = z
  .string()
  .regex(/^[A-Za-z0-9_-]{8,64}$/, "a tunnel id is 8 to 64 letters, digits, '-' or '_', fresh for each connection");

/**
 * Opens one TCP connection to `port` on the session's own loopback (docs/sessions.md#ports) and
 * relays its bytes over the tunnel's subjects, which the caller subscribes to (`.out`) before
 * asking: the session's first bytes may come before the reply.
 */
export const ConnectRequest = z.strictObject({ id: SessionId, port: Port, tunnel: TunnelId });
export type ConnectRequest = z.input<typeof ConnectRequest>;
export const TunnelInfo = z.strictObject({
  tunnel: TunnelId,
  port: Port,
  /** Where the caller sends the bytes for the port, and where the port's bytes come. */
  in: z.string(),
  out: z.string(),
  /** The most bytes either end sends that the other has not acknowledged. */
  window: z.number().int().positive(),
  openedAt: z.iso.datetime(),
});
export type TunnelInfo = z.infer<typeof TunnelInfo>;
export const ConnectReply = z.strictObject({ tunnel: TunnelInfo });
/** What a dispatcher asks the session's worker: the request, and the user whose tunnel it is (its subjects carry the name). */
export const WorkerConnect = ConnectRequest.extend({ user: z.string().regex(TOKEN_PATTERN) });

/** A terminal's width or height, in characters. */
const TerminalCells = z.number().int("a terminal's size is whole characters").min(1).max(10_000);

/**
 * Starts a shell (or `argv`) on a terminal in the session (docs/sessions.md#shell): a process of
 * its background whose terminal's bytes go through a tunnel of the caller's, as a port's do
 * (`<prefix>.tunnel.<user>.<tunnel>.in|out`, `.out` listened on before asking), its window's size
 * changed by a `Boxcar-Resize` message and its exit said on the tunnel's end (`Boxcar-Exit`).
 */
export const ShellRequest = z.strictObject({
  id: SessionId,
  tunnel: TunnelId,
  cols: TerminalCells,
  rows: TerminalCells,
  /** What runs on the terminal; default: the session's `bash` if it has one, else `/bin/sh`. */
  argv: z
    .array(z.string().max(16 * 1024))
    .min(1)
    .max(256)
    .optional(),
  env: z.record(EnvName, z.string().max(16 * 1024)).default({}),
  /** A folder of the workspace to start in; default: the workspace. */
  cwd: SessionPath.optional(),
  /** `TERM` for what runs on it (the caller's own, for its terminal's abilities); default `xterm-256color`. */
  term: z
    .string()
    .regex(/^[A-Za-z0-9._+-]{1,64}$/, "a terminal type is letters, digits, '.', '_', '+' or '-'")
    .default("xterm-256color"),
  timeout: durationMs({ min: 1_000, max: 24 * HOUR })
    .default(8 * HOUR)
    .describe("the shell is ended (hung up) after this long"),
});
export type ShellRequest = z.input<typeof ShellRequest>;
export const ShellReply = z.strictObject({
  process: ProcessInfo,
  /** Where the caller sends its keys (`in`) and reads the terminal (`out`), and the window of each way. */
  tunnel: z.strictObject({
    tunnel: TunnelId,
    in: z.string(),
    out: z.string(),
    window: z.number().int().positive(),
    openedAt: z.iso.datetime(),
  }),
});
export type ShellReply = z.infer<typeof ShellReply>;
/** What a dispatcher asks the session's worker: the request, and the user whose tunnel it is. */
export const WorkerShell = ShellRequest.extend({ user: z.string().regex(TOKEN_PATTERN) });

export const ListSessionFiles = z.strictObject({
  id: SessionId,
  /** A folder of the workspace to list; default: all of it. */
  path: SessionPath.optional(),
  limit: z.number().int().min(1).max(10_000).default(1_000),
});
export type ListSessionFiles = z.input<typeof ListSessionFiles>;
export const SessionFilesReply = z.strictObject({
  /** Regular files (symlinks are neither listed nor followed), by path. */
  files: z.array(z.strictObject({ path: z.string(), size: z.number().int().nonnegative() })),
  /** There were more than `limit`. */
  truncated: z.boolean(),
});
export const RemovedSessionFile = z.strictObject({ path: z.string(), removed: z.boolean() });

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
  request: z.looseObject({ idleTimeout: z.number(), maxLifetime: z.number(), git: GitSeed.optional() }),
  /** The snapshot the workspace starts with, already checked to be the caller's. */
  from: SnapshotId.optional(),
  /** The artifacts the workspace starts with (of a job checked to be the caller's), and that job. */
  artifacts: z.strictObject({ job: z.string(), files: z.array(Artifact) }).optional(),
  /**
   * The caller is an admin. Only an admin may open a host session (its commands run as the
   * worker's own user), and only an admin's session gets the agent's secrets (whatever a command
   * gets, its caller can read).
   */
  byAdmin: z.boolean(),
  /** The template asked for, as the system policy has it: its image in place of the agent's. */
  template: z.strictObject({ name: SessionTemplateName, image: z.string().min(1) }).optional(),
  /** The agent definition, as the dispatcher read it. */
  agent: z.unknown(),
});

/** A worker's answer to a dispatcher: the data, or why not. */
export const WorkerReply = z.discriminatedUnion("ok", [
  z.strictObject({ ok: z.literal(true), data: z.unknown() }),
  z.strictObject({
    ok: z.literal(false),
    error: ErrorInfo,
    /** False when the worker does not hold the session (it restarted): the session is lost. */
    held: z.literal(false).optional(),
  }),
]);
