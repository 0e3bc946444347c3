import { readFileSync } from "node:fs";
import { lchown } from "node:fs/promises";
import { type Duplex, PassThrough, type Readable } from "node:stream";
import { StringDecoder } from "node:string_decoder";
import { BoxcarError, ErrorCode, type ResourceLimits } from "@boxcar/protocol";
import type Docker from "dockerode";
import type { SessionFiles, WorkspaceFile } from "../../workspace/files.js";
import type { LocalWorkspace } from "../../workspace/local-workspace.js";
import { packFolder } from "../../workspace/workspace-archive.js";
import { workspaceSegments } from "../../workspace/workspace-path.js";
import { type WorkspaceLimits, WorkspaceQuota } from "../../workspace/workspace-quota.js";
import { refusal } from "../loopback.js";
import type { ExecOptions, ExecResult, JobFiles, SessionSandbox, Terminal, TerminalOptions } from "../sandbox.js";
import { filesInParts, type PartFiles } from "../session-job-sandbox.js";
import { createAttached } from "./attached-container.js";
import { type ConnectionFrame, HelperConnection } from "./helper-connection.js";

/** The resident helper's source (helper/session-helper.cjs), run by the image's `node`. */
const HELPER_SOURCE = readFileSync(new URL("../../../helper/session-helper.cjs", import.meta.url), "utf8");

/** How long a helper has to say it is ready once its container has started. */
const READY_TIMEOUT_MS = 30_000;
/** How long a helper has to end a command it was told to stop (it sends SIGKILL after 2 s) before the session is ended. */
const KILL_TIMEOUT_MS = 10_000;
/** How long the helper has to answer a file operation before the session is ended. */
const FILE_OPERATION_TIMEOUT_MS = 30_000;
/** File operations one session may have under way at once. */
const MAX_FILE_OPERATIONS = 4;
/** The most a listing may take, in bytes of its paths (and some for each entry's JSON): well within a message. */
const MAX_LISTING_BYTES = 384 * 1024;
/** The longest line a helper may send: an output frame is at most 64 KiB of base64 and JSON; past this the helper is broken. */
const MAX_FRAME = 1024 * 1024;

/** What a session container is made of; the caller (the Docker provider) hardens it as a job's. */
export interface SessionContainerSpec {
  id: string;
  /** The container: name, image, user, labels and the hardened host configuration with the workspace bind-mounted. */
  create: Docker.ContainerCreateOptions;
  description: { image: string; network: string; limits: ResourceLimits };
  agentPath: string;
  /** The agent's user, to whom the workspace folder is given. */
  owner: { uid: number; gid: number };
  quota: WorkspaceLimits;
  /** Called once the container and the workspace are removed (the provider stops counting it as its own). */
  destroyed?: () => void;
}

/** A line from the helper: untrusted, every field checked where it is read. */
interface Frame {
  t?: unknown;
  id?: unknown;
  s?: unknown;
  d?: unknown;
  code?: unknown;
  signal?: unknown;
  error?: unknown;
  files?: Array<{ path?: unknown; size?: unknown }>;
  truncated?: unknown;
  removed?: unknown;
  size?: unknown;
  n?: unknown;
  end?: unknown;
}

/** A request to the helper waiting for its answer: a command (output, then its exit) or a file operation. */
interface Pending {
  onOutput?: ExecOptions["onOutput"];
  answered(frame: Frame): void;
  failed(err: Error): void;
}

/**
 * A Docker sandbox kept for a session: one container for the session's life, with the job
 * containers' hardening and the workspace bind-mounted, running a resident helper
 * (helper/session-helper.cjs) that starts each command in it and reads and writes its files. A
 * command costs one line to the helper and its frames back, not a `docker exec`.
 *
 * The helper runs as the agent's user, so a command can tamper with it: its frames are taken
 * as the session's own word about its own commands (output, exit codes), bounded in size, and a
 * helper that does not end a command when told is ended with its container.
 */
export class DockerSession implements SessionSandbox {
  readonly kind = "docker";
  readonly workspace = "/workspace";
  readonly agentPath: string;
  /** The workspace as this worker's folder, bind-mounted (a Unix socket made there reaches the container). */
  readonly localFolder: string;
  readonly description: SessionContainerSpec["description"];
  readonly ended: Promise<string>;
  readonly sessionFiles: SessionFiles;
  readonly jobFiles: JobFiles;
  private endedWith: string | undefined;
  private end!: (reason: string) => void;
  /** The requests the helper has not answered yet, by id. */
  private readonly pending = new Map<string, Pending>();
  /** Connections the helper holds to ports of the container's loopback, by the id of their `connect`. */
  private readonly connections = new Map<string, HelperConnection>();
  /** Terminals running, by the id of their `pty`: told their exit, or that the session ended. */
  private readonly terminals = new Map<string, { exited(frame: Frame): void; failed(err: Error): void }>();
  /** File operations sent and not yet answered. */
  private fileOperations = 0;
  /** Paused by the worker (a snapshot, or the session's pause): the helper cannot answer, and is not counted late for it. */
  private paused = false;
  private count = 0;
  private buffered = "";
  private readonly quota: WorkspaceQuota;
  private destroyed: Promise<void> | undefined;

  private constructor(
    readonly id: string,
    private readonly container: Docker.Container,
    private readonly stream: NodeJS.ReadWriteStream,
    private readonly files: LocalWorkspace,
    private readonly spec: SessionContainerSpec,
  ) {
    this.agentPath = spec.agentPath;
    this.localFolder = files.dir;
    this.description = spec.description;
    const helperFiles = new HelperFiles((frame) => this.ask(frame));
    this.sessionFiles = helperFiles;
    this.jobFiles = filesInParts(helperFiles);
    this.ended = new Promise((resolve) => {
      this.end = (reason) => {
        if (this.endedWith !== undefined) return;
        this.endedWith = reason;
        for (const pending of this.pending.values()) pending.failed(this.endedError());
        this.pending.clear();
        for (const connection of this.connections.values()) connection.destroy(this.endedError());
        for (const terminal of this.terminals.values()) terminal.failed(this.endedError());
        this.terminals.clear();
        resolve(reason);
      };
    });
    // Watched for the session's whole life: a command's children may write on after it ends.
    this.quota = new WorkspaceQuota(files.dir, spec.quota, (reason) => this.kill(reason));
  }

  /** Creates and starts the container and waits for its helper; removes what it made if that fails. */
  static async start(docker: Docker, spec: SessionContainerSpec, files: LocalWorkspace): Promise<DockerSession> {
    // The source in the environment, not the command line, so a session's `ps` shows a short one.
    const { container, stream } = await createAttached(
      docker,
      { ...spec.create, Cmd: ["node", "-e", "eval(process.env.BOXCAR_HELPER)"], Env: [`BOXCAR_HELPER=${HELPER_SOURCE}`] },
      // Its stdin ends when this worker's connection does: the helper then kills what runs and
      // exits, and the container stops with it (one attempt alive: docs/reliability.md).
      true,
    );
    let session: DockerSession | undefined;
    try {
      if (process.getuid?.() !== spec.owner.uid) await lchown(files.dir, spec.owner.uid, spec.owner.gid);
      session = new DockerSession(spec.id, container, stream, files, spec);
      const ready = session.follow(docker);
      await container.start();
      await ready;
      return session;
    } catch (err) {
      session?.quota.stop();
      await container.remove({ force: true, v: true }).catch(() => undefined);
      throw err;
    }
  }

  /** Reads the helper's frames; resolves once it is ready, rejects (naming why) if its container ends first. */
  private follow(docker: Docker): Promise<void> {
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let complaint = "";
    stderr.on("data", (chunk: Buffer) => {
      complaint = (complaint + chunk.toString()).slice(-2_000);
    });
    docker.modem.demuxStream(this.stream, stdout, stderr);
    // Lines are UTF-8: a character split between two chunks is joined again.
    const decoder = new StringDecoder("utf8");
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new BoxcarError(ErrorCode.sandboxFailed, `the session's helper did not start within ${READY_TIMEOUT_MS / 1000} s`));
      }, READY_TIMEOUT_MS);
      stdout.on("data", (chunk: Buffer) => {
        this.buffered += decoder.write(chunk);
        let newline = this.buffered.indexOf("\n");
        while (newline >= 0) {
          const frame = parseFrame(this.buffered.slice(0, newline));
          this.buffered = this.buffered.slice(newline + 1);
          if (frame?.t === "ready") {
            clearTimeout(timer);
            resolve();
          } else if (frame) this.take(frame);
          newline = this.buffered.indexOf("\n");
        }
        if (this.buffered.length > MAX_FRAME) {
          this.buffered = "";
          this.kill("its helper sent a line of more than 1 MiB");
        }
      });
      const over = () => {
        clearTimeout(timer);
        const said = complaint.trim();
        const why = /node: (not found|No such file)|executable file not found/i.test(said)
          ? `the image ${this.description.image} has no node on its PATH: a Docker session's helper needs Node.js in the image (the default image has it)`
          : `its helper exited${said ? `: ${said.split("\n").at(-1)}` : ""}`;
        this.end(why);
        reject(this.endedError());
      };
      this.stream.once("end", over);
      this.stream.once("close", over);
      this.stream.once("error", over);
    });
  }

  private take(frame: Frame): void {
    if (frame.t === "data" || frame.t === "ack" || frame.t === "hangup") {
      if (typeof frame.id === "string") this.connections.get(frame.id)?.hear(frame as ConnectionFrame);
      return;
    }
    if (frame.t === "exit" && typeof frame.id === "string" && this.terminals.has(frame.id)) {
      this.terminals.get(frame.id)?.exited(frame);
      this.terminals.delete(frame.id);
      return;
    }
    const pending = typeof frame.id === "string" ? this.pending.get(frame.id) : undefined;
    if (!pending) return;
    if (frame.t === "out" && (frame.s === "stdout" || frame.s === "stderr") && typeof frame.d === "string") {
      pending.onOutput?.(frame.s, Buffer.from(frame.d, "base64"));
    } else if (frame.t === "exit" || frame.t === "done") {
      this.pending.delete(frame.id as string);
      pending.answered(frame);
    }
  }

  /**
   * Sends a request and waits for the helper's answer (a command's: its exit). A file operation
   * that is not answered within `FILE_OPERATION_TIMEOUT_MS` ends the session: a helper held still
   * (a command stopped it, a named pipe blocks it) must not make the worker keep requests for ever.
   */
  private ask(frame: Record<string, unknown>, onOutput?: ExecOptions["onOutput"], id = this.nextId()): Promise<Frame> {
    if (this.endedWith !== undefined) return Promise.reject(this.endedError());
    // Answered within the same bound; a connection is not counted among the file operations (its
    // session's tunnels are bounded on their own).
    const fileOperation = frame.t !== "exec" && frame.t !== "connect" && frame.t !== "pty";
    const answerBound = frame.t !== "exec";
    if (fileOperation && this.fileOperations >= MAX_FILE_OPERATIONS) {
      return Promise.reject(
        new BoxcarError(
          ErrorCode.conflict,
          `${MAX_FILE_OPERATIONS} file operations are under way in this session: one at a time is plenty`,
        ),
      );
    }
    return new Promise<Frame>((answered, failed) => {
      let timer: NodeJS.Timeout | undefined;
      const settle = () => {
        clearTimeout(timer);
        if (fileOperation) this.fileOperations -= 1;
      };
      if (fileOperation) this.fileOperations += 1;
      if (answerBound) {
        timer = this.unlessPaused(
          () => this.kill(`its helper did not answer a file operation within ${FILE_OPERATION_TIMEOUT_MS / 1000} s`),
          FILE_OPERATION_TIMEOUT_MS,
          (next) => {
            timer = next;
          },
        );
      }
      this.pending.set(id, {
        onOutput,
        answered: (f) => {
          settle();
          answered(f);
        },
        failed: (err) => {
          settle();
          failed(err);
        },
      });
      this.stream.write(`${JSON.stringify({ ...frame, id })}\n`);
    });
  }

  /** A new request id: the helper's answers and a command's kill name it. */
  private nextId(): string {
    this.count += 1;
    return String(this.count);
  }

  /** Sends the helper a frame, unless the session has ended. */
  private writeFrame(frame: Record<string, unknown>): void {
    if (this.endedWith === undefined) this.stream.write(`${JSON.stringify(frame)}\n`);
  }

  /**
   * The worker's end of a byte stream the helper relays (a port's connection, a terminal), known
   * before the helper is asked: its first bytes may come right after the helper's answer. Its
   * errors are its user's to hear; one that fails to open is thrown by the asker.
   */
  private newConnection(id: string): HelperConnection {
    const connection = new HelperConnection(
      id,
      (frame) => this.writeFrame(frame),
      () => {
        if (this.connections.get(id) === connection) this.connections.delete(id);
      },
    );
    connection.on("error", () => {});
    this.connections.set(id, connection);
    return connection;
  }

  /**
   * A connection to `port` on the container's own loopback, opened by the helper inside the
   * container's network namespace (which has its loopback even with no network): the worker names
   * a port, never a host, so nothing but the container's own listeners is reached.
   */
  async connect(port: number): Promise<Duplex> {
    if (this.endedWith !== undefined) throw this.endedError();
    const id = this.nextId();
    const connection = this.newConnection(id);
    let answer: Frame;
    try {
      answer = await this.ask({ t: "connect", port }, undefined, id);
    } catch (err) {
      connection.destroy();
      throw err;
    }
    if (typeof answer.error === "string") {
      connection.destroy();
      throw refusal(port, new Error(answer.error.slice(0, 300)), typeof answer.code === "string" ? answer.code : undefined);
    }
    return connection;
  }

  /**
   * Starts `argv` (default: the image's bash, else sh) on a pseudo-terminal in the container: the
   * helper runs it under `script` as it runs commands (the agent's user, the container's limits,
   * nothing of it in the container's configuration) and relays its bytes as a connection's.
   */
  async openTerminal(argv: readonly string[] | undefined, opts: TerminalOptions): Promise<Terminal> {
    if (this.endedWith !== undefined) throw this.endedError();
    const id = this.nextId();
    const io = this.newConnection(id);
    const startedAt = performance.now();
    let killed = false;
    let backstop: NodeJS.Timeout | undefined;
    const exited = new Promise<ExecResult>((resolve, reject) => {
      this.terminals.set(id, {
        exited: (frame) => {
          clearTimeout(backstop);
          resolve({
            exitCode: Number.isInteger(frame.code) ? (frame.code as number) : null,
            signal: typeof frame.signal === "string" ? frame.signal.slice(0, 16) : null,
            aborted: killed,
            durationMs: performance.now() - startedAt,
          });
        },
        failed: (err) => {
          clearTimeout(backstop);
          reject(err);
        },
      });
    });
    exited.catch(() => {});
    const forget = () => {
      this.terminals.delete(id);
      io.destroy();
    };
    let answer: Frame;
    try {
      answer = await this.ask(
        {
          t: "pty",
          ...(argv ? { argv } : {}),
          env: opts.env,
          ...(opts.cwd !== undefined ? { cwd: relative(opts.cwd) } : {}),
          cols: opts.cols,
          rows: opts.rows,
        },
        undefined,
        id,
      );
    } catch (err) {
      forget();
      throw err;
    }
    if (typeof answer.error === "string") {
      forget();
      throw new BoxcarError(ErrorCode.invalid, `cannot start a terminal: ${answer.error.slice(0, 500)}`);
    }
    return {
      io,
      exited,
      resize: (cols, rows) => this.writeFrame({ t: "resize", id, cols, rows }),
      kill: () => {
        if (killed) return;
        killed = true;
        this.writeFrame({ t: "kill", id });
        backstop = this.unlessPaused(
          () => this.kill(`its helper did not end terminal ${id} within ${KILL_TIMEOUT_MS / 1000} s of being told to`),
          KILL_TIMEOUT_MS,
          (next) => {
            backstop = next;
          },
        );
      },
    };
  }

  /** Runs one command (the session host lets one run at a time). */
  async exec(argv: string[], opts: ExecOptions): Promise<ExecResult> {
    const id = this.nextId();
    const startedAt = performance.now();
    let aborted = false;
    let backstop: NodeJS.Timeout | undefined;
    const onAbort = () => {
      aborted = true;
      this.stream.write(`${JSON.stringify({ t: "kill", id })}\n`);
      backstop = this.unlessPaused(
        () => this.kill(`its helper did not end command ${id} within ${KILL_TIMEOUT_MS / 1000} s of being told to`),
        KILL_TIMEOUT_MS,
        (next) => {
          backstop = next;
        },
      );
    };
    opts.signal.addEventListener("abort", onAbort, { once: true });
    try {
      const asked = this.ask(
        {
          t: "exec",
          argv,
          env: opts.env,
          ...(opts.cwd !== undefined ? { cwd: relative(opts.cwd) } : {}),
          ...(opts.stdin ? { stdin: Buffer.from(opts.stdin).toString("base64") } : {}),
        },
        opts.onOutput,
        id,
      );
      if (opts.signal.aborted) onAbort();
      const exit = await asked;
      if (typeof exit.error === "string") {
        throw new BoxcarError(ErrorCode.invalid, `cannot start command ${JSON.stringify(argv[0])}: ${exit.error.slice(0, 500)}`);
      }
      return {
        exitCode: Number.isInteger(exit.code) ? (exit.code as number) : null,
        signal: typeof exit.signal === "string" ? exit.signal.slice(0, 16) : null,
        aborted,
        durationMs: performance.now() - startedAt,
      };
    } finally {
      clearTimeout(backstop);
      opts.signal.removeEventListener("abort", onAbort);
    }
  }

  /**
   * The workspace as a tar, read with the container paused (the cgroup freezer holds every
   * process of it still), so that nothing can swap a folder for a symlink while the worker reads
   * the bind-mounted folder; unpaused once the archive has been read, or has failed.
   */
  async packWorkspace(): Promise<Readable> {
    await this.pause();
    let resumed = false;
    const resume = () => {
      if (resumed) return;
      resumed = true;
      void this.container
        .unpause()
        .catch(() => undefined)
        .finally(() => {
          this.paused = false;
        });
    };
    const archive = packFolder(this.files.dir, this.spec.owner);
    archive.once("end", resume);
    archive.once("close", resume);
    archive.once("error", resume);
    return archive;
  }

  /**
   * Pauses the container (the cgroup freezer: every process of it, the helper, background
   * processes and shells, held where it is, its memory kept) until `resume`. The helper's
   * deadlines wait meanwhile, as during a snapshot.
   */
  async pause(): Promise<void> {
    if (this.endedWith !== undefined) throw this.endedError();
    this.paused = true;
    try {
      await this.container.pause();
    } catch (err) {
      this.paused = false;
      throw new BoxcarError(ErrorCode.sandboxFailed, `could not pause the session's container: ${(err as Error).message}`);
    }
  }

  /** Unpauses the container: what it held goes on from where it was. */
  async resume(): Promise<void> {
    if (this.endedWith !== undefined) throw this.endedError();
    try {
      await this.container.unpause();
    } catch (err) {
      throw new BoxcarError(ErrorCode.sandboxFailed, `could not resume the session's container: ${(err as Error).message}`);
    }
    this.paused = false;
  }

  /**
   * Runs `late` after `ms`, unless the container is paused then (a snapshot, a pause): the helper is held
   * still by the worker, not failing; the wait starts again once it runs. `rearmed` gets each new timer.
   */
  private unlessPaused(late: () => void, ms: number, rearmed: (timer: NodeJS.Timeout) => void): NodeJS.Timeout {
    return setTimeout(() => {
      if (this.paused) rearmed(this.unlessPaused(late, ms, rearmed));
      else late();
    }, ms);
  }

  /** Ends the session's container (its quota broken, its helper misbehaving): `ended` says why. */
  private kill(reason: string): void {
    this.end(reason);
    void this.container.kill({ signal: "SIGKILL" }).catch(() => undefined);
  }

  private endedError(): BoxcarError {
    return new BoxcarError(ErrorCode.sandboxFailed, `the session's container ended: ${this.endedWith}`);
  }

  /**
   * Removes the container, and only once it is gone the workspace: nothing may run in the folder
   * while the worker removes it (a symlink swapped in mid-walk would lead the removal out of it).
   */
  destroy(): Promise<void> {
    this.destroyed ??= (async () => {
      this.quota.stop();
      this.end("closed");
      try {
        // A paused container is let go first: the engine may refuse to kill one (its removal's SIGKILL).
        if (this.paused) await this.container.unpause().catch(() => undefined);
        await this.container.remove({ force: true, v: true }).catch((err: { statusCode?: number }) => {
          // 409: another removal (the reaper's) is under way; 404: gone.
          if (err.statusCode !== 404 && err.statusCode !== 409) throw err;
        });
        await gone(this.container);
        await this.files.remove();
      } finally {
        this.spec.destroyed?.();
      }
    })();
    return this.destroyed;
  }
}

/** A session's files, read and written by its helper inside the container. Its answers are bounded here. */
class HelperFiles implements SessionFiles, PartFiles {
  constructor(private readonly ask: (frame: Record<string, unknown>) => Promise<Frame>) {}

  async read(path: string, max: number): Promise<Uint8Array | null> {
    const answer = await this.answer({ t: "read", path: relative(path), max }, path);
    if (answer === null) return null;
    const data = Buffer.from(typeof answer.d === "string" ? answer.d : "", "base64");
    if (data.length > max) throw new BoxcarError(ErrorCode.tooLarge, `${path} has more than ${max} bytes`);
    return data;
  }

  async readPart(path: string, offset: number, length: number): Promise<{ data: Uint8Array; size: number } | null> {
    const answer = await this.answer({ t: "read", path: relative(path), offset, length }, path);
    if (answer === null) return null;
    const data = Buffer.from(typeof answer.d === "string" ? answer.d : "", "base64");
    if (data.length > length || !Number.isSafeInteger(answer.size) || (answer.size as number) < 0) {
      throw new BoxcarError(ErrorCode.sandboxFailed, `the session's helper answered a read of ${path} with more than was asked`);
    }
    return { data, size: answer.size as number };
  }

  async mkdir(path: string): Promise<void> {
    if ((await this.answer({ t: "mkdir", path: relative(path) }, path)) === null) {
      throw new BoxcarError(ErrorCode.invalid, `cannot make folder ${path}: a file is on its way`);
    }
  }

  async write(path: string, data: Uint8Array, executable = false, append = false): Promise<void> {
    const frame = { t: "write", path: relative(path), d: Buffer.from(data).toString("base64"), executable, append };
    if ((await this.answer(frame, path)) === null) {
      throw new BoxcarError(ErrorCode.notFound, `cannot write ${path}: a folder on its way is missing`);
    }
  }

  async list(path: string | undefined, limit: number): Promise<{ files: WorkspaceFile[]; truncated: boolean }> {
    const frame = { t: "list", ...(path === undefined ? {} : { path: relative(path) }), limit, bytes: MAX_LISTING_BYTES };
    const answer = await this.answer(frame, path ?? ".");
    if (answer === null) throw new BoxcarError(ErrorCode.notFound, `no folder ${path} in the workspace`);
    const files = (Array.isArray(answer.files) ? answer.files : [])
      .slice(0, limit)
      .filter((f): f is WorkspaceFile => typeof f?.path === "string" && Number.isInteger(f.size) && (f.size as number) >= 0);
    return { files, truncated: answer.truncated === true };
  }

  async remove(path: string): Promise<boolean> {
    const answer = await this.answer({ t: "remove", path: relative(path) }, path);
    return answer?.removed === true;
  }

  /** The helper's answer; null when the path is not there; its other errors as a refusal naming the path. */
  private async answer(frame: Record<string, unknown>, path: string): Promise<Frame | null> {
    const answer = await this.ask(frame);
    if (typeof answer.error !== "string") return answer;
    if (answer.code === "ENOENT" || answer.code === "ENOTDIR") return null;
    const code = answer.code === "EFBIG" ? ErrorCode.tooLarge : ErrorCode.invalid;
    throw new BoxcarError(code, `${path}: ${answer.error.slice(0, 500)}`);
  }
}

/** A workspace-relative path as the helper takes it: no `..`, not absolute (refused here, by the worker). */
function relative(path: string): string {
  return workspaceSegments(path).join("/");
}

/** Resolves once the engine no longer has the container; gives up (rejects) after 60 s. */
async function gone(container: Docker.Container): Promise<void> {
  for (let waited = 0; waited < 60_000; waited += 200) {
    const found = await container.inspect().catch((err: { statusCode?: number }) => {
      if (err.statusCode === 404) return undefined;
      throw err;
    });
    if (!found) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new BoxcarError(
    ErrorCode.sandboxFailed,
    "the session's container is still there a minute after its removal: its workspace is kept",
  );
}

function parseFrame(line: string): Frame | undefined {
  try {
    const frame: unknown = JSON.parse(line);
    return frame !== null && typeof frame === "object" ? (frame as Frame) : undefined;
  } catch {
    return undefined;
  }
}
