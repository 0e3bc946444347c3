import { spawn } from "node:child_process";
import { constants } from "node:fs";
import { access, lchown, readdir, stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import type { Duplex, Readable, Writable } from "node:stream";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { LocalFilesSandbox, LocalSessionFiles, type LocalWorkspace, WorkspaceRoot } from "../../workspace/local-workspace.js";
import { defaultWorkRoot } from "../../workspace/work-root.js";
import { packFolder } from "../../workspace/workspace-archive.js";
import { workspaceDir, workspaceSegments } from "../../workspace/workspace-path.js";
import { beatLine, underLifeline } from "../lifeline.js";
import { connectLoopback } from "../loopback.js";
import { signalGroup } from "../process-group.js";
import type { ExecOptions, ExecResult, JobFiles, Sandbox, SandboxProvider, SessionSandbox, Terminal, TerminalOptions } from "../sandbox.js";
import { openHostTerminal } from "./host-terminal.js";

export interface HostSandboxOptions {
  /** Folder under which workspaces are created; default {@link defaultWorkRoot}. */
  root?: string;
  /** How long a command may take to end after SIGTERM before its process group gets SIGKILL; default 2000 ms. */
  killGraceMs?: number;
  /**
   * Run agents as this user and group instead of the worker's own (needs a worker running as
   * root): the workspace is handed to that user first, and the agent cannot read the worker's
   * environment or memory through `/proc`, nor signal it. Default: the worker's user.
   */
  user?: { uid: number; gid: number };
  /** The system's identity (`Topology.systemId`), in workspaces' names: see `WorkspaceRoot.sweep`. */
  system?: string;
}

/**
 * Sandboxes that are plain child processes in a private temporary workspace. They isolate
 * nothing but the environment and the working folder: for development and trusted agents.
 */
export function createHostSandboxProvider(opts: HostSandboxOptions = {}): SandboxProvider {
  const root = new WorkspaceRoot(opts.root ?? defaultWorkRoot(), opts.system);
  const killGraceMs = opts.killGraceMs ?? 2_000;
  return {
    kind: "host",
    available: async () => true,
    async create(spec, signal) {
      signal?.throwIfAborted();
      return new HostSandbox(spec.id, await root.create({ workerId: spec.workerId, sandboxId: spec.id }), killGraceMs, opts.user);
    },
    async createSession(spec, seed) {
      const files = await root.create({ workerId: spec.workerId, sandboxId: spec.id });
      try {
        await seed?.(files);
      } catch (err) {
        await files.remove();
        throw err;
      }
      return new HostSandbox(spec.id, files, killGraceMs, opts.user);
    },
  };
}

class HostSandbox extends LocalFilesSandbox implements Sandbox, SessionSandbox {
  readonly kind = "host";
  /** Process groups started here that may still have members. */
  private readonly groups = new Set<number>();
  /** The process groups of its terminals that may still run (`script`'s, and the shell's once known). */
  private readonly terminals = new Set<readonly number[]>();
  private destroyed: Promise<void> | undefined;

  readonly workspace: string;

  constructor(
    readonly id: string,
    files: LocalWorkspace,
    private readonly killGraceMs: number,
    private readonly user: { uid: number; gid: number } | undefined,
  ) {
    super(files);
    this.workspace = files.dir;
  }

  get sessionFiles(): LocalSessionFiles {
    return new LocalSessionFiles(this.files);
  }

  /** A host session's files, as a job's: its own (an admin's session; its commands run as the worker anyway). */
  get jobFiles(): JobFiles {
    return this;
  }

  /** Read while its commands may run: a host session is an admin's, whose commands run as the worker anyway. */
  async packWorkspace(): Promise<Readable> {
    return packFolder(this.workspace, { uid: process.getuid?.() ?? 0, gid: process.getgid?.() ?? 0 });
  }

  /** A connection to a port of the worker's own loopback: a host session's commands run as the worker, and listen there. */
  connect(port: number): Promise<Duplex> {
    if (this.destroyed) return Promise.reject(new BoxcarError(ErrorCode.sandboxFailed, `sandbox ${this.id} is destroyed`));
    return connectLoopback(port);
  }

  /** A process on a pseudo-terminal of the worker's machine (`script`'s), as the session's commands run. */
  async openTerminal(argv: readonly string[] | undefined, opts: TerminalOptions): Promise<Terminal> {
    if (this.destroyed) throw new BoxcarError(ErrorCode.sandboxFailed, `sandbox ${this.id} is destroyed`);
    if (this.user) await chownTree(this.workspace, this.user.uid, this.user.gid);
    const cwd = opts.cwd === undefined ? this.workspace : await workspaceDir(this.workspace, workspaceSegments(opts.cwd), opts.cwd, false);
    if (cwd === null) throw new BoxcarError(ErrorCode.invalid, `cwd ${JSON.stringify(opts.cwd)}: no such folder in the workspace`);
    const terminal = await openHostTerminal(argv, { ...opts, cwd, user: this.user, killGraceMs: this.killGraceMs });
    // Killed with the sandbox: `script`'s group, and the shell's (a session of its own).
    this.terminals.add(terminal.pids);
    void terminal.exited.then(() => this.terminals.delete(terminal.pids));
    return terminal;
  }

  async exec(argv: string[], opts: ExecOptions): Promise<ExecResult> {
    const [command, ...args] = argv;
    if (command === undefined) throw new BoxcarError(ErrorCode.invalid, "exec needs a command");
    if (this.destroyed) throw new BoxcarError(ErrorCode.sandboxFailed, `sandbox ${this.id} is destroyed`);
    if (opts.signal.aborted) return { exitCode: null, signal: null, aborted: true, durationMs: 0 };

    const startedAt = performance.now();
    if (this.user) await chownTree(this.workspace, this.user.uid, this.user.gid);
    const cwd = opts.cwd === undefined ? this.workspace : await workspaceDir(this.workspace, workspaceSegments(opts.cwd), opts.cwd, false);
    if (cwd === null) throw new BoxcarError(ErrorCode.invalid, `cwd ${JSON.stringify(opts.cwd)}: no such folder in the workspace`);
    // The shell that runs the lifeline would only say 127: a command that cannot start is told apart first.
    if (!(await findCommand(command, opts.env.PATH, cwd))) {
      throw new BoxcarError(ErrorCode.agentFailed, `cannot start agent command ${JSON.stringify(command)}: not found, or not executable`);
    }
    // Under a lifeline on fd 3: the agent's process group dies with this worker, however it dies,
    // or once the attempt's lease goes unconfirmed (lifeline.ts).
    const [shell, ...shellArgs] = underLifeline([command, ...args], "fd3", opts.attemptLease?.msLeft());
    const child = spawn(shell as string, shellArgs, {
      cwd,
      env: opts.env,
      detached: true,
      stdio: ["pipe", "pipe", "pipe", "pipe"],
      ...(this.user ? { uid: this.user.uid, gid: this.user.gid } : {}),
    });
    const pgid = child.pid;
    if (pgid !== undefined) this.groups.add(pgid);
    const lifeline = child.stdio[3] as Writable;
    lifeline.on("error", () => {}); // the sentinel is gone: the group is going too
    const stopBeating = opts.attemptLease?.onRenewed((msLeft) => lifeline.write(beatLine(msLeft)));
    // Closed at once (a job's agent reads nothing), or after what a session's command is given.
    child.stdin.on("error", () => {}); // a command that does not read it all
    child.stdin.end(opts.stdin);
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
        stopBeating?.();
        lifeline.destroy();
        opts.signal.removeEventListener("abort", onAbort);
        for (const t of timers) clearTimeout(t);
        if (pgid !== undefined) this.groups.delete(pgid);
      };
      opts.signal.addEventListener("abort", onAbort, { once: true });
      // Aborted while the command was looked up: it stops at once (a listener added now never hears it).
      if (opts.signal.aborted) onAbort();
      child.once("error", (err) => {
        settle();
        reject(
          new BoxcarError(ErrorCode.agentFailed, `cannot start agent command ${JSON.stringify(command)}: ${err.message}`, { cause: err }),
        );
      });
      child.once("exit", () => {
        // The run ends with the command: whatever it left running in its group goes too (the
        // sentinel included; the lifeline's end is let go, so nothing else waits on it).
        kill("SIGKILL");
        lifeline.destroy();
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

  destroy(): Promise<void> {
    this.destroyed ??= (async () => {
      for (const pgid of [...this.groups, ...[...this.terminals].flat()]) signalGroup(pgid, "SIGKILL");
      this.groups.clear();
      this.terminals.clear();
      await this.files.remove();
    })();
    return this.destroyed;
  }
}

/** Hands a workspace to the agent's user: the folder and everything in it. */
async function chownTree(dir: string, uid: number, gid: number): Promise<void> {
  await lchown(dir, uid, gid);
  for (const entry of await readdir(dir, { recursive: true })) await lchown(join(dir, entry), uid, gid);
}

/** Whether `command` names an executable file: a path (from `cwd`), or a name found on `path`, as a shell's `exec` looks it up. */
async function findCommand(command: string, path: string | undefined, cwd: string): Promise<boolean> {
  const candidates = command.includes("/")
    ? [resolve(cwd, command)]
    : (path ?? "")
        .split(":")
        .filter((dir) => dir !== "")
        .map((dir) => resolve(cwd, dir, command));
  for (const file of candidates) {
    const ok = await access(file, constants.X_OK).then(
      async () => (await stat(file)).isFile(),
      () => false,
    );
    if (ok) return true;
  }
  return false;
}
