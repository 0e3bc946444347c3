import type { Duplex, Readable } from "node:stream";
import type { ResourceLimits, ResourceUsage, RuntimeWishes, SandboxBackend } from "@boxcar/protocol";
import type { SessionFiles, WorkspaceFile } from "../workspace/files.js";
import type { LocalWorkspace } from "../workspace/local-workspace.js";
import type { AttemptLease } from "./lifeline.js";

export type { SandboxBackend };

/** What a provider needs to create the sandbox of one attempt of one job. */
export interface SandboxSpec {
  /**
   * The id the sandbox reports as {@link Sandbox.id}, chosen by the worker so events can name
   * the sandbox from `creating` on; backends also use it to name or label what they create.
   */
  id: string;
  jobId: string;
  attempt: number;
  workerId: string;
  runtime: RuntimeWishes;
  /**
   * Hosts the sandbox reaches even when its network is `none` (the model gateway's public
   * address, for a sandbox off this machine); a backend that reaches the gateway another way ignores it.
   */
  egress?: string[];
  /**
   * `many`: it runs many commands one after another (a prompt agent's tool calls), not one agent;
   * a backend whose job sandboxes run one command (Docker's) makes one that runs many. Default `one`.
   */
  commands?: "one" | "many";
  /** A session's: the longest its sandbox may live (default: a job's timeout); a backend whose sandboxes end by themselves (E2B) keeps it alive that long. */
  lifetimeMs?: number;
  /** A session opened from a template (docs/sessions.md#templates): `runtime.image` is its image, which must be on the engine already (never pulled). */
  template?: { name: string; image: string };
}

/** Creates sandboxes of one backend. */
export interface SandboxProvider {
  readonly kind: SandboxBackend;
  /** Whether this worker can offer the backend now (e.g. a Docker engine answers). */
  available(): Promise<boolean>;
  /** Creates a sandbox with an empty workspace; aborting `signal` abandons the creation. */
  create(spec: SandboxSpec, signal?: AbortSignal): Promise<Sandbox>;
  /**
   * Creates a sandbox kept for a session (docs/sessions.md); absent: this backend holds no
   * sessions. `seed` fills its workspace (a snapshot's files) before anything runs in it.
   */
  createSession?(spec: SandboxSpec, seed?: (workspace: LocalWorkspace) => Promise<void>): Promise<SessionSandbox>;
  /**
   * Removes what crashed workers left behind: every sandbox of this system (running or not)
   * whose owner `isOrphan` says is gone. Returns how many it removed. Backends whose sandboxes
   * cannot outlive the worker (host) have nothing to reap.
   */
  reap?(isOrphan: (owner: SandboxOwner) => Promise<boolean>): Promise<number>;
  /**
   * Removes the sandboxes of `jobId`'s attempts before `attempt` that this backend can reach (a
   * crashed or frozen worker's, still running), as a new attempt starts. Returns how many.
   */
  removeEarlierAttempts?(jobId: string, attempt: number): Promise<number>;
  /**
   * Called once the worker has started, with its id: a backend that keeps sandboxes ready
   * before jobs come (Docker's warm pool) starts making them, labelled as this worker's.
   * `onError` hears what goes wrong doing so (it never fails a job).
   */
  prepare?(workerId: string, onError: (err: unknown) => void): void;
  /** How many sandboxes stand ready for jobs to come: all, or those for an image and network. */
  warmReady?(kind?: { image?: string; network?: string }): number;
  /** Removes the sandboxes kept ready; called when the worker stops. */
  close?(): Promise<void>;
}

/**
 * Which attempt of which job on which worker a sandbox belongs to (Docker labels carry it). A
 * warm sandbox no job has taken yet has a worker only.
 */
export interface SandboxOwner {
  jobId?: string;
  attempt?: number;
  workerId: string;
}

export interface ExecOptions {
  /** The complete environment of the command: nothing else is inherited. */
  env: Record<string, string>;
  /** Aborting kills the command and everything it started. */
  signal: AbortSignal;
  /** Output as it arrives, in order per stream. */
  onOutput(stream: "stdout" | "stderr", chunk: Uint8Array): void;
  /** A folder of the workspace to run in (relative); default: the workspace. Sessions only. */
  cwd?: string;
  /** What the command reads on stdin; default: nothing. Sessions only. */
  stdin?: Uint8Array;
  /**
   * The attempt's hold on its job (a job's agent): the command's lifeline beats with its
   * confirmed renewals, and the command is killed once they stop coming. Absent (a session's
   * command): the command dies with the worker only.
   */
  attemptLease?: AttemptLease;
}

export interface ExecResult {
  /** The exit code, or null when the command was ended by a signal. */
  exitCode: number | null;
  signal: string | null;
  /** True when the command was ended because `signal` aborted. */
  aborted: boolean;
  durationMs: number;
  /** True when it was killed for using more memory than its limit. */
  oomKilled?: boolean;
  /** What it used, where the backend can measure it. */
  usage?: ResourceUsage;
  /** Why the sandbox killed the command for breaking one of its bounds (its workspace's quota); the attempt fails so. */
  breach?: string;
}

/**
 * One isolated place to run one attempt of one job. Paths are relative to the workspace and
 * may not leave it (no `..`, no absolute paths, no symlinks pointing outside).
 */
export interface Sandbox {
  readonly id: string;
  readonly kind: SandboxBackend;
  /** Absolute path of the workspace as seen inside the sandbox; commands run there. */
  readonly workspace: string;
  /** The PATH agents get here; absent: the worker's own (host). */
  readonly agentPath?: string;
  /**
   * The workspace as a folder of this machine that the sandbox sees as its own (the host's own
   * folder, or a bind mount): a Unix socket made there reaches the sandbox. Absent: the sandbox
   * has a copy, or is elsewhere.
   */
  readonly localFolder?: string;
  /** What the sandbox runs with, for its events: image or template, network, limits. */
  readonly description?: { image?: string; network?: string; limits?: ResourceLimits; start?: "warm_hit" | "cold" };
  /** Runs `argv` in the workspace; resolves when it and everything it started have ended. */
  exec(argv: string[], opts: ExecOptions): Promise<ExecResult>;
  /** Creates the folder and its parents. */
  mkdir(path: string): Promise<void>;
  /** Writes a file, creating its parent folders and replacing what was there. */
  writeFile(path: string, data: Uint8Array | ReadableStream<Uint8Array>): Promise<void>;
  /** The file's bytes, or null when there is no such regular file. */
  readFile(path: string): Promise<ReadableStream<Uint8Array> | null>;
  /**
   * Every regular file in the workspace; symlinks are neither listed nor followed. `under`: the
   * caller wants only those under these folders, which a backend may use to list less (a
   * session's workspace); callers filter what comes back anyway.
   */
  listFiles(under?: readonly string[]): Promise<WorkspaceFile[]>;
  /** Ends every process and removes the sandbox with its workspace. Safe to call twice. */
  destroy(): Promise<void>;
}

/** What a job does with its sandbox's files: lay out its input, read its result and artifacts. */
export type JobFiles = Pick<Sandbox, "mkdir" | "writeFile" | "readFile" | "listFiles">;

/** A sandbox kept for a session: commands run in it one after another, and its files are reached between and during them. */
export interface SessionSandbox extends Pick<Sandbox, "id" | "kind" | "workspace" | "agentPath" | "description" | "exec" | "destroy"> {
  readonly sessionFiles: SessionFiles;
  /** Its files as a job run in the session (docs/sessions.md#jobs-in-a-session) reads and writes them, of any size. */
  readonly jobFiles: JobFiles;
  /**
   * A tar of the workspace's folders and regular files (symlinks and the rest are left out), read
   * with nothing of the session running meanwhile where the backend can hold it still (a
   * container is paused until the archive has been read).
   */
  packWorkspace(): Promise<Readable>;
  /** Resolves, saying why, when the sandbox ended by itself (its container stopped, its quota was broken). */
  readonly ended?: Promise<string>;
  /**
   * Opens a TCP connection to `port` on the sandbox's own loopback (docs/sessions.md#ports):
   * inside a Docker session's container (its helper connects, in the container's network
   * namespace), the worker's own for a host session. Rejects `unavailable` when nothing listens
   * there. Absent where it is not built (E2B).
   */
  connect?(port: number): Promise<Duplex>;
  /**
   * Starts `argv` (default: the sandbox's `bash`, else `/bin/sh`) on a pseudo-terminal of its own
   * (docs/sessions.md#shell), as its commands run (its user, limits, environment, a folder of
   * the workspace). Absent where it is not built (E2B).
   */
  openTerminal?(argv: readonly string[] | undefined, opts: TerminalOptions): Promise<Terminal>;
  /**
   * Holds every process of the sandbox where it is, its memory kept (docs/sessions.md#pause): a
   * container frozen by the cgroup freezer. Nothing of it runs until `resume`. Absent where the
   * backend cannot hold them all (host, E2B).
   */
  pause?(): Promise<void>;
  /** Lets what `pause` held go on from where it was. */
  resume?(): Promise<void>;
}

export interface TerminalOptions {
  /** The complete environment (`TERM` in it): nothing else is inherited. */
  env: Record<string, string>;
  /** A folder of the workspace (relative); default: the workspace. */
  cwd?: string;
  cols: number;
  rows: number;
}

/** A process on a pseudo-terminal, as its sandbox runs it. */
export interface Terminal {
  /** The terminal's bytes: what is written is typed on it, what is read is what it shows. */
  readonly io: Duplex;
  /** Its window is `cols` by `rows` now (what runs on it hears SIGWINCH). */
  resize(cols: number, rows: number): void;
  /** Hangs it up: SIGHUP to what runs on it, SIGKILL a moment later to what is left. Safe to call twice. */
  kill(): void;
  /** How it ended (`aborted` once killed). */
  readonly exited: Promise<ExecResult>;
}

/** A sandbox that runs commands one after another, as a session's does, seen as a job's `Sandbox`. */
export function sandboxOfSession(session: SessionSandbox & { readonly localFolder?: string }): Sandbox {
  const { jobFiles } = session;
  return {
    id: session.id,
    kind: session.kind,
    workspace: session.workspace,
    ...(session.agentPath ? { agentPath: session.agentPath } : {}),
    ...(session.localFolder ? { localFolder: session.localFolder } : {}),
    ...(session.description ? { description: session.description } : {}),
    exec: (argv, opts) => session.exec(argv, opts),
    mkdir: (path) => jobFiles.mkdir(path),
    writeFile: (path, data) => jobFiles.writeFile(path, data),
    readFile: (path) => jobFiles.readFile(path),
    listFiles: (under) => jobFiles.listFiles(under),
    destroy: () => session.destroy(),
  };
}
