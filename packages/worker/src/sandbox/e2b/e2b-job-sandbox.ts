/**
 * One job attempt's E2B sandbox (`E2BSandbox`; a session's too, which `E2BSession` wraps): the
 * agent run through the sandbox's login shell in its own process group with exactly its
 * environment, its end read (`signalOf`), the sandbox's E2B timeout kept with the attempt's
 * lease or the session's lifetime, its workspace's files through E2B's file API, and the
 * sandbox killed when the attempt ends. The E2B provider (e2b-sandbox.ts) makes these.
 */

import { randomBytes } from "node:crypto";
import { posix } from "node:path";
import { BoxcarError, ErrorCode, type ResourceLimits } from "@boxcar/protocol";
import { CommandExitError, type CommandHandle, type Sandbox as E2BRemoteSandbox, FileNotFoundError, InvalidArgumentError } from "e2b";
import { AgentPaths } from "../../workspace/agent-contract.js";
import type { WorkspaceFile } from "../../workspace/files.js";
import { workspaceSegments } from "../../workspace/workspace-path.js";
import { raceAbort } from "../abort.js";
import type { ExecOptions, ExecResult, Sandbox } from "../sandbox.js";
import { shellQuote } from "../shell-word.js";
import { agentCommand, environmentFile } from "./e2b-command.js";
import { e2bError, firstLine } from "./e2b-errors.js";

/** How deep a listing of a job's workspace goes (E2B's ListDir takes a depth). */
const LIST_DEPTH = 4096;
/** Bound on the small clean-up commands run after the agent. */
const CLEANUP_TIMEOUT_MS = 10_000;

export interface E2BSandboxSettings {
  workspace: string;
  agentPath: string;
  description: { image: string; network: string; limits: ResourceLimits };
  lifetimeMs: number;

  killGraceMs: number;
}

/** One attempt's E2B sandbox (or a session's, which `E2BSession` wraps). */
export class E2BSandbox implements Sandbox {
  readonly kind = "e2b";
  readonly workspace: string;
  readonly agentPath: string;
  readonly description: { image: string; network: string; limits: ResourceLimits };
  private destroyed: Promise<void> | undefined;
  /** A session's: when E2B ends it (`keepUntil`); each command keeps it until then, no longer. */
  private endsAt: number | undefined;
  /** A job's: stops pushing its end on with its attempt's lease. */
  private stopRenewing: (() => void) | undefined;

  constructor(
    readonly id: string,
    private readonly remote: E2BRemoteSandbox,
    private readonly settings: E2BSandboxSettings,
  ) {
    this.workspace = settings.workspace;
    this.agentPath = settings.agentPath;
    this.description = settings.description;
  }

  /**
   * Runs the agent through the sandbox's login shell as `setsid env -i NAME=value… argv`: in its
   * own process group, with exactly `env`. The environment travels as a file written through the
   * file API and removed before the agent starts, so no value (secrets included) is part of the
   * process-start request, which E2B's daemon logs. Ends with the group killed, so nothing the
   * agent started outlives it.
   */
  async exec(argv: string[], opts: ExecOptions): Promise<ExecResult> {
    const scratch = `${this.workspace}/${AgentPaths.reserved}/${randomBytes(8).toString("hex")}`;
    const envFile = `${scratch}-env`;
    const stdinFile = opts.stdin ? `${scratch}-stdin` : undefined;
    const line = agentCommand(argv, envFile, stdinFile);
    const envBytes = environmentFile(opts.env);
    this.checkLive();
    const cwd = opts.cwd === undefined ? this.workspace : `${this.workspace}/${workspaceSegments(opts.cwd).join("/")}`;
    if (opts.cwd !== undefined) await this.checkFolder(cwd, opts.cwd);
    const notRun: ExecResult = { exitCode: null, signal: null, aborted: true, durationMs: 0 };
    const written = [envFile, ...(stdinFile ? [stdinFile] : [])];
    const writes = [
      this.remote.files.write(envFile, new Blob([envBytes])),
      ...(stdinFile && opts.stdin ? [this.remote.files.write(stdinFile, new Blob([opts.stdin]))] : []),
    ];
    // The command line removes them before the agent starts; when it does not start, this does
    // (once the writes have ended, so none lands after): the environment holds the secrets.
    const removeFiles = () => {
      void Promise.allSettled(writes).then(() => Promise.allSettled(written.map((file) => this.remote.files.remove(file))));
    };
    // The backstop counts again from the agent's start. A session's: what is left of its lifetime
    // (a job in the session is held by the session, whose sandbox dies with its worker's presence).
    // A job's own sandbox: until its lease's stop time, pushed on at each confirmed renewal, so
    // E2B ends it before JetStream can give the job to another attempt if this worker dies,
    // freezes or loses NATS (lifeline.ts); once the agent has ended, the full time limit plus the
    // margin again, for its files to be read. Else the command's full time limit plus the margin.
    const { endsAt } = this;
    const lease = endsAt === undefined ? opts.attemptLease : undefined;
    const lifetimeMs = lease
      ? e2bSeconds(lease.msLeft())
      : endsAt === undefined
        ? this.settings.lifetimeMs
        : Math.max(1_000, endsAt - Date.now());
    if (lease) {
      this.stopRenewing?.();
      this.stopRenewing = lease.onRenewed((msLeft) => {
        this.remote.setTimeout(e2bSeconds(msLeft)).catch(() => {}); // missed: the sandbox ends at the last stop time, as the lease does
      });
    }
    const prepared = await raceAbort(
      Promise.all([this.remote.setTimeout(lifetimeMs), ...writes]).then(() => true),
      opts.signal,
    ).catch((err: unknown) => {
      removeFiles();
      throw e2bError(err, `could not prepare the agent's start in E2B sandbox ${this.remote.sandboxId}`);
    });
    if (!prepared) {
      removeFiles();
      return notRun;
    }

    const encoder = new TextEncoder();
    const startedAt = performance.now();
    const starting = this.remote.commands.run(line, {
      background: true,
      cwd,
      // No deadline: envd kills a command whose call times out; the job's own timer decides.
      timeoutMs: 0,
      onStdout: (text) => opts.onOutput("stdout", encoder.encode(text)),
      onStderr: (text) => opts.onOutput("stderr", encoder.encode(text)),
    });
    const handle = await raceAbort(starting, opts.signal).catch((err: unknown) => {
      removeFiles();
      throw e2bError(err, `could not start the agent in E2B sandbox ${this.remote.sandboxId}`);
    });
    if (!handle) {
      starting.then((late) => this.killAgent(late)).catch(() => {});
      removeFiles();
      return notRun;
    }

    type Ended = { exitCode: number; error?: string } | { failure: unknown } | { stopped: true };
    const waiting = handle.wait().then(
      (result): Ended => ({ exitCode: result.exitCode }),
      (err: unknown): Ended =>
        err instanceof CommandExitError ? { exitCode: err.exitCode, ...(err.error ? { error: err.error } : {}) } : { failure: err },
    );
    let aborted = false;
    let gaveUp: NodeJS.Timeout | undefined;
    let stopWaiting: (ended: Ended) => void = () => {};
    const stopped = new Promise<Ended>((resolve) => (stopWaiting = resolve));
    const onAbort = () => {
      aborted = true;
      void this.killAgent(handle);
      // A sandbox that does not answer cannot hold the job: destroy() kills it anyway.
      gaveUp = setTimeout(() => {
        void handle.disconnect();
        stopWaiting({ stopped: true });
      }, this.settings.killGraceMs);
    };
    opts.signal.addEventListener("abort", onAbort, { once: true });
    if (opts.signal.aborted) onAbort();
    let ended: Ended;
    try {
      ended = await Promise.race([waiting, stopped]);
    } finally {
      opts.signal.removeEventListener("abort", onAbort);
      clearTimeout(gaveUp);
    }
    const durationMs = performance.now() - startedAt;

    if ("failure" in ended && !aborted) {
      throw e2bError(ended.failure, `lost the agent's command in E2B sandbox ${this.remote.sandboxId}`);
    }
    // Whatever the agent left running in its process group goes too, and the files it was started
    // with, if it was stopped before its command line removed them.
    await this.run(`kill -KILL -- -${handle.pid} 2>/dev/null; rm -f ${written.map(shellQuote).join(" ")}; true`);
    if (lease) {
      // No agent runs any more: its files are read with the full time (the job's end destroys it).
      this.stopRenewing?.();
      this.stopRenewing = undefined;
      await this.remote.setTimeout(this.settings.lifetimeMs).catch(() => {});
    }
    if (!("exitCode" in ended)) return { exitCode: null, signal: "SIGKILL", aborted, durationMs };
    const signal = ended.exitCode === -1 ? signalOf(ended.error) : null;
    return signal === null
      ? { exitCode: ended.exitCode, signal: null, aborted, durationMs }
      : { exitCode: null, signal, aborted, durationMs };
  }

  /** Refuses a `cwd` that is not a folder of the workspace, before anything is written for the command. */
  private async checkFolder(path: string, asked: string): Promise<void> {
    const info = await this.remote.files.getInfo(path).catch((err: unknown) => {
      if (err instanceof FileNotFoundError) return undefined;
      throw this.fileError(err, `could not look at cwd ${asked}`);
    });
    if (info?.type !== "dir") throw new BoxcarError(ErrorCode.invalid, `cwd ${asked}: no such folder in the workspace`);
  }

  /** A session's sandbox: E2B ends it at `at` (ms since the epoch), however many commands run in it until then. */
  async keepUntil(at: number): Promise<void> {
    this.endsAt = at;
    await this.remote.setTimeout(Math.max(1_000, at - Date.now())).catch((err: unknown) => {
      throw e2bError(err, `could not set the lifetime of E2B sandbox ${this.remote.sandboxId}`);
    });
  }

  /** SIGKILL to the agent's process and its group. */
  private async killAgent(handle: CommandHandle): Promise<void> {
    await Promise.allSettled([handle.kill(), this.run(`kill -KILL -- -${handle.pid} 2>/dev/null; true`)]);
  }

  /** Runs a short command of Boxcar's own, ignoring how it went. */
  private async run(command: string): Promise<void> {
    await this.remote.commands.run(command, { timeoutMs: CLEANUP_TIMEOUT_MS, requestTimeoutMs: CLEANUP_TIMEOUT_MS }).catch(() => {});
  }

  async mkdir(path: string): Promise<void> {
    const target = this.remotePath(path);
    try {
      await this.remote.files.makeDir(target);
    } catch (err) {
      throw this.fileError(err, `could not create folder ${path}`);
    }
  }

  async writeFile(path: string, data: Uint8Array | ReadableStream<Uint8Array>): Promise<void> {
    const target = this.remotePath(path);
    try {
      await this.remote.files.write(target, data instanceof Uint8Array ? new Blob([data]) : data);
    } catch (err) {
      throw this.fileError(err, `could not write ${path}`);
    }
  }

  async readFile(path: string): Promise<ReadableStream<Uint8Array> | null> {
    const target = this.remotePath(path);
    try {
      return await this.remote.files.read(target, { format: "stream" });
    } catch (err) {
      // Missing (404) or a folder (400): no such regular file.
      if (err instanceof FileNotFoundError || err instanceof InvalidArgumentError) return null;
      throw this.fileError(err, `could not read ${path}`);
    }
  }

  async listFiles(): Promise<WorkspaceFile[]> {
    this.checkLive();
    let entries: Awaited<ReturnType<E2BRemoteSandbox["files"]["list"]>>;
    try {
      entries = await this.remote.files.list(this.workspace, { depth: LIST_DEPTH });
    } catch (err) {
      throw this.fileError(err, "could not list the workspace");
    }
    if (entries.length === 0) return [];
    // Entries carry absolute paths under the workspace's resolved path: the folder of the
    // shortest one (a top-level entry) is that path. A symlink has its target's type, and a
    // `symlinkTarget`: it is no regular file of the workspace.
    const shortest = entries.reduce((a, b) => (b.path.length < a.path.length ? b : a));
    const root = `${posix.dirname(shortest.path)}/`;
    return entries
      .filter((e) => e.type === "file" && e.symlinkTarget === undefined && e.path.startsWith(root))
      .map((e) => ({ path: e.path.slice(root.length), size: e.size }));
  }

  /** Kills the E2B sandbox, which ends every process and removes its disk. Safe to call twice. */
  destroy(): Promise<void> {
    this.stopRenewing?.();
    this.destroyed ??= this.remote.kill().then(
      () => {},
      (err: unknown) => {
        throw e2bError(err, `could not kill E2B sandbox ${this.remote.sandboxId}`);
      },
    );
    return this.destroyed;
  }

  private remotePath(path: string): string {
    this.checkLive();
    return `${this.workspace}/${workspaceSegments(path).join("/")}`;
  }

  private checkLive(): void {
    if (this.destroyed) throw new BoxcarError(ErrorCode.sandboxFailed, `sandbox ${this.id} is destroyed`);
  }

  private fileError(err: unknown, doing: string): BoxcarError {
    if (err instanceof InvalidArgumentError) return new BoxcarError(ErrorCode.invalid, `${doing}: ${firstLine(err)}`, { cause: err });
    return e2bError(err, `${doing} in E2B sandbox ${this.remote.sandboxId}`);
  }
}

/** How Go (and so E2B's daemon) names signals in a process's status, e.g. `signal: killed`. */
const GO_SIGNALS: Record<string, string> = {
  hangup: "SIGHUP",
  interrupt: "SIGINT",
  quit: "SIGQUIT",
  "illegal instruction": "SIGILL",
  "trace/breakpoint trap": "SIGTRAP",
  aborted: "SIGABRT",
  "bus error": "SIGBUS",
  "floating point exception": "SIGFPE",
  killed: "SIGKILL",
  "user defined signal 1": "SIGUSR1",
  "segmentation fault": "SIGSEGV",
  "user defined signal 2": "SIGUSR2",
  "broken pipe": "SIGPIPE",
  "alarm clock": "SIGALRM",
  terminated: "SIGTERM",
  "CPU time limit exceeded": "SIGXCPU",
};

/**
 * The signal that ended a process, from the daemon's status text (`signal: killed`): the only
 * place the SDK reports it (its exit code is then -1).
 */
export function signalOf(status: string | undefined): string | null {
  const name = status?.startsWith("signal: ") ? status.slice("signal: ".length) : undefined;
  if (name === undefined) return null;
  return GO_SIGNALS[name] ?? name;
}

/** A stop time as E2B takes it: whole seconds, which it rounds, so cut down to one (at least one). */
function e2bSeconds(ms: number): number {
  return Math.max(1_000, Math.floor(ms / 1_000) * 1_000);
}
