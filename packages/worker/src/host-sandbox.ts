import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { type FileHandle, lstat, mkdir, mkdtemp, open, readdir, realpath, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { signalGroup } from "./process-group.js";
import type { ExecOptions, ExecResult, Sandbox, SandboxProvider, WorkspaceFile } from "./sandbox.js";
import { escapeError, workspaceDir, workspaceSegments } from "./workspace-path.js";

export interface HostSandboxOptions {
  /** Folder under which workspaces are created; default the OS temporary folder. */
  root?: string;
  /** How long a command may take to end after SIGTERM before its process group gets SIGKILL; default 2000 ms. */
  killGraceMs?: number;
}

/**
 * Sandboxes that are plain child processes in a private temporary workspace. They isolate
 * nothing but the environment and the working folder: for development and trusted agents.
 */
export function createHostSandboxProvider(opts: HostSandboxOptions = {}): SandboxProvider {
  const root = opts.root ?? tmpdir();
  const killGraceMs = opts.killGraceMs ?? 2_000;
  return {
    kind: "host",
    available: async () => true,
    async create(spec, signal) {
      signal?.throwIfAborted();
      await mkdir(root, { recursive: true });
      // mkdtemp creates the folder with mode 0700: only this user can see the workspace.
      const workspace = await realpath(await mkdtemp(join(root, `boxcar-${spec.id}-`)));
      return new HostSandbox(spec.id, workspace, killGraceMs);
    },
  };
}

const WRITE_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW;
const READ_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW;

class HostSandbox implements Sandbox {
  readonly kind = "host";
  /** Process groups started here that may still have members. */
  private readonly groups = new Set<number>();
  private destroyed: Promise<void> | undefined;

  constructor(
    readonly id: string,
    readonly workspace: string,
    private readonly killGraceMs: number,
  ) {}

  exec(argv: string[], opts: ExecOptions): Promise<ExecResult> {
    const [command, ...args] = argv;
    if (command === undefined) return Promise.reject(new BoxcarError(ErrorCode.invalid, "exec needs a command"));
    if (this.destroyed) return Promise.reject(new BoxcarError(ErrorCode.sandboxFailed, `sandbox ${this.id} is destroyed`));
    if (opts.signal.aborted) return Promise.resolve({ exitCode: null, signal: null, aborted: true, durationMs: 0 });

    const startedAt = performance.now();
    const child = spawn(command, args, { cwd: this.workspace, env: opts.env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
    const pgid = child.pid;
    if (pgid !== undefined) this.groups.add(pgid);
    child.stdout.on("data", (chunk: Buffer) => opts.onOutput("stdout", chunk));
    child.stderr.on("data", (chunk: Buffer) => opts.onOutput("stderr", chunk));

    return new Promise<ExecResult>((resolve, reject) => {
      let aborted = false;
      const timers: NodeJS.Timeout[] = [];
      const kill = (signal: NodeJS.Signals) => pgid !== undefined && signalGroup(pgid, signal);
      const onAbort = () => {
        aborted = true;
        kill("SIGTERM");
        timers.push(setTimeout(() => kill("SIGKILL"), this.killGraceMs));
      };
      const settle = () => {
        opts.signal.removeEventListener("abort", onAbort);
        for (const t of timers) clearTimeout(t);
        if (pgid !== undefined) this.groups.delete(pgid);
      };
      opts.signal.addEventListener("abort", onAbort, { once: true });
      child.once("error", (err) => {
        settle();
        reject(
          new BoxcarError(ErrorCode.agentFailed, `cannot start agent command ${JSON.stringify(command)}: ${err.message}`, { cause: err }),
        );
      });
      child.once("exit", () => {
        // The run ends with the command: whatever it left running in its group goes too.
        kill("SIGKILL");
        // A process that left the group may still hold the pipes open: stop waiting for it.
        timers.push(
          setTimeout(() => {
            child.stdout.destroy();
            child.stderr.destroy();
          }, this.killGraceMs),
        );
      });
      child.once("close", (exitCode: number | null, signal: NodeJS.Signals | null) => {
        settle();
        resolve({ exitCode, signal, aborted, durationMs: performance.now() - startedAt });
      });
    });
  }

  async mkdir(path: string): Promise<void> {
    await workspaceDir(this.workspace, this.segments(path), path, true);
  }

  async writeFile(path: string, data: Uint8Array | ReadableStream<Uint8Array>): Promise<void> {
    const segments = this.segments(path);
    const dir = await workspaceDir(this.workspace, segments.slice(0, -1), path, true);
    const file = await openNoFollow(join(dir ?? this.workspace, segments.at(-1) ?? ""), WRITE_FLAGS, path);
    try {
      // writeFile on a handle writes at the current position: chunks land one after another.
      if (data instanceof Uint8Array) await file.writeFile(data);
      else for await (const chunk of data) await file.writeFile(chunk);
    } finally {
      await file.close();
    }
  }

  async readFile(path: string): Promise<ReadableStream<Uint8Array> | null> {
    const segments = this.segments(path);
    const dir = await workspaceDir(this.workspace, segments.slice(0, -1), path, false);
    if (dir === null) return null;
    const file = await openNoFollow(join(dir, segments.at(-1) ?? ""), READ_FLAGS, path).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return null;
      throw err;
    });
    if (!file) return null;
    if (!(await file.stat()).isFile()) {
      await file.close();
      return null;
    }
    return Readable.toWeb(file.createReadStream()) as ReadableStream<Uint8Array>;
  }

  async listFiles(): Promise<WorkspaceFile[]> {
    const files: WorkspaceFile[] = [];
    const walk = async (dir: string, prefix: string): Promise<void> => {
      for (const entry of await readdir(dir, { withFileTypes: true })) {
        const path = prefix + entry.name;
        if (entry.isDirectory()) await walk(join(dir, entry.name), `${path}/`);
        else if (entry.isFile()) files.push({ path, size: (await lstat(join(dir, entry.name))).size });
      }
    };
    await walk(this.workspace, "");
    return files;
  }

  destroy(): Promise<void> {
    this.destroyed ??= (async () => {
      for (const pgid of this.groups) signalGroup(pgid, "SIGKILL");
      this.groups.clear();
      await rm(this.workspace, { recursive: true, force: true });
    })();
    return this.destroyed;
  }

  private segments(path: string): string[] {
    if (this.destroyed) throw new BoxcarError(ErrorCode.sandboxFailed, `sandbox ${this.id} is destroyed`);
    return workspaceSegments(path);
  }
}

/** Opens without following a symlink in the last segment; a symlink there is an escape attempt. */
async function openNoFollow(target: string, flags: number, path: string): Promise<FileHandle> {
  try {
    return await open(target, flags, 0o644);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ELOOP") throw escapeError(path);
    throw err;
  }
}
