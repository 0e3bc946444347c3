import { randomBytes } from "node:crypto";
import { posix } from "node:path";
import { BoxcarError, ErrorCode, type ResourceLimits } from "@boxcar/protocol";
import { CommandExitError, type CommandHandle, E2B, type Sandbox as E2BRemoteSandbox, FileNotFoundError, InvalidArgumentError } from "e2b";
import { AgentPaths } from "../../workspace/agent-contract.js";
import type { WorkspaceFile } from "../../workspace/files.js";
import { workspaceSegments } from "../../workspace/workspace-path.js";
import { raceAbort } from "../abort.js";
import type { ExecOptions, ExecResult, Sandbox, SandboxOwner, SandboxProvider, SandboxSpec } from "../sandbox.js";
import { agentCommand, environmentFile, shellQuote } from "./e2b-command.js";
import { e2bError, firstLine } from "./e2b-errors.js";
import { E2BSession, seedRemote } from "./e2b-session.js";

export interface E2BSandboxOptions {
  /**
   * The worker's E2B API key, e.g. `E2B_API_KEY` from its environment; never a job's. Without
   * one the backend is not offered (`available()` is false).
   */
  apiKey?: string;
  /** E2B's domain, e.g. of a self-hosted E2B; default the SDK's (`E2B_DOMAIN`, else `e2b.app`). */
  domain?: string;
  /** The control-plane API; default the SDK's (`E2B_API_URL`, else `https://api.<domain>`). */
  apiUrl?: string;
  /** One URL for every sandbox's daemon; default the SDK's (`E2B_SANDBOX_URL`, else per-sandbox hosts). */
  sandboxUrl?: string;
  /** Template for agents that name none; default `base`. */
  defaultTemplate?: string;
  /**
   * How long a sandbox outlives its job's time limit: its own E2B timeout, a backstop that ends
   * it should the worker vanish. Counted from creation and again from the agent's start; it
   * also covers copying files in and out. Default 300000 ms.
   */
  timeoutMarginMs?: number;
  /**
   * The workspace inside the sandbox: an absolute path, or one relative to the sandbox user's
   * home. Default `workspace`, which is `/home/user/workspace` on E2B's templates.
   */
  workspace?: string;
  /**
   * Names this Boxcar system in its sandboxes' metadata, so `reap` removes only its own
   * sandboxes. Without it the provider has no `reap`.
   */
  prefix?: string;
  /**
   * The system's identity (`Topology.systemId`), also in the metadata: `reap` leaves alone the
   * sandboxes of another system that shares the prefix (and the E2B account).
   */
  system?: string;
  /** PATH the agent gets; default the Debian one E2B's templates use. */
  agentPath?: string;
  /** How long a killed agent may take to report its end before the run stops waiting; default 10000 ms. */
  killGraceMs?: number;
}

export interface ResolvedE2BSandboxOptions {
  apiKey: string | undefined;
  domain: string | undefined;
  apiUrl: string | undefined;
  sandboxUrl: string | undefined;
  defaultTemplate: string;
  timeoutMarginMs: number;
  workspace: string;
  prefix: string | undefined;
  system: string | undefined;
  agentPath: string;
  killGraceMs: number;
}

/** Metadata keys on every E2B sandbox Boxcar creates. */
export const E2BMetadata = {
  prefix: "boxcarPrefix",
  system: "boxcarSystem",
  job: "boxcarJob",
  /** On a session's sandbox, in place of the job and attempt: the session it is kept for. */
  session: "boxcarSession",
  attempt: "boxcarAttempt",
  worker: "boxcarWorker",
  sandbox: "boxcarSandbox",
} as const;

/** How deep a listing of a job's workspace goes (E2B's ListDir takes a depth). */
const LIST_DEPTH = 4096;
const DEFAULT_AGENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/** Bound on the small clean-up commands run after the agent. */
const CLEANUP_TIMEOUT_MS = 10_000;

/** Fills in defaults and checks every option; throws an `invalid` error naming the bad one. */
export function resolveE2BSandboxOptions(opts: E2BSandboxOptions): ResolvedE2BSandboxOptions {
  const resolved: ResolvedE2BSandboxOptions = {
    apiKey: opts.apiKey || undefined,
    domain: opts.domain || undefined,
    apiUrl: opts.apiUrl || undefined,
    sandboxUrl: opts.sandboxUrl || undefined,
    defaultTemplate: opts.defaultTemplate ?? "base",
    timeoutMarginMs: opts.timeoutMarginMs ?? 300_000,
    workspace: opts.workspace ?? "workspace",
    prefix: opts.prefix || undefined,
    system: opts.system || undefined,
    agentPath: opts.agentPath ?? DEFAULT_AGENT_PATH,
    killGraceMs: opts.killGraceMs ?? 10_000,
  };
  const bad = (what: string) => new BoxcarError(ErrorCode.invalid, `E2B sandbox options: ${what}`);
  if (!resolved.defaultTemplate) throw bad("defaultTemplate must not be empty");
  if (!Number.isInteger(resolved.timeoutMarginMs) || resolved.timeoutMarginMs < 0) throw bad("timeoutMarginMs must be a whole number ≥ 0");
  if (!Number.isInteger(resolved.killGraceMs) || resolved.killGraceMs < 0) throw bad("killGraceMs must be a whole number ≥ 0");
  const ws = resolved.workspace;
  if (!ws || ws.includes("\0") || ws.split("/").includes("..") || ws === "/") {
    throw bad("workspace must be a folder path without '..', absolute or relative to the sandbox user's home");
  }
  for (const [name, url] of [
    ["apiUrl", resolved.apiUrl],
    ["sandboxUrl", resolved.sandboxUrl],
  ] as const) {
    if (url !== undefined && !URL.canParse(url)) throw bad(`${name} ${JSON.stringify(url)} is not a URL`);
  }
  return resolved;
}

/**
 * Sandboxes that are E2B cloud sandboxes (Firecracker microVMs), driven through the official
 * `e2b` SDK. Each job attempt gets its own sandbox, created from the agent's template with
 * metadata naming the attempt, killed when the attempt ends, and given an E2B timeout of the
 * job's time limit plus a margin as a backstop. See docs/e2b.md.
 */
export function createE2BSandboxProvider(opts: E2BSandboxOptions = {}): SandboxProvider {
  const settings = resolveE2BSandboxOptions(opts);
  // The SDK falls back to E2B_* variables for what is not given; debug is pinned off so
  // E2B_DEBUG can never make it skip the API.
  const client =
    settings.apiKey === undefined
      ? undefined
      : new E2B({
          apiKey: settings.apiKey,
          debug: false,
          ...(settings.domain ? { domain: settings.domain } : {}),
          ...(settings.apiUrl ? { apiUrl: settings.apiUrl } : {}),
          ...(settings.sandboxUrl ? { sandboxUrl: settings.sandboxUrl } : {}),
        });

  const provider: SandboxProvider = {
    kind: "e2b",
    // Configured is enough: asking E2B on every heartbeat would cost a call per worker per beat.
    available: async () => client !== undefined,

    async create(spec, signal) {
      return (await start(spec, { signal })).sandbox;
    },

    async createSession(spec, seed) {
      const { sandbox, remote } = await start(spec, { session: true });
      try {
        if (seed) await seedRemote(remote, sandbox.workspace, seed);
        // The session's lifetime counts from now, once it is ready (the seed took its time): its
        // worker closes it then, and E2B would end it a margin later.
        await sandbox.keepUntil(Date.now() + (spec.lifetimeMs ?? 0) + settings.timeoutMarginMs);
        return new E2BSession(sandbox, remote);
      } catch (err) {
        await sandbox.destroy().catch(() => {});
        throw err;
      }
    },
  };

  /** Creates an E2B sandbox for `spec` (a job's attempt, or a `session`'s) with its workspace made. */
  async function start(
    spec: SandboxSpec,
    { signal, session = false }: { signal?: AbortSignal | undefined; session?: boolean },
  ): Promise<{ sandbox: E2BSandbox; remote: E2BRemoteSandbox }> {
    if (!client) {
      throw new BoxcarError(ErrorCode.sandboxFailed, "this worker has no E2B API key: set E2B_API_KEY in the worker's environment");
    }
    signal?.throwIfAborted();
    const { runtime } = spec;
    const template = runtime.template ?? settings.defaultTemplate;
    const allowInternetAccess = internetAccess(runtime.network);
    if (runtime.limits.pids !== undefined) {
      throw new BoxcarError(
        ErrorCode.invalid,
        `runtime.limits.pids is ${runtime.limits.pids}, but E2B cannot limit the processes of a sandbox: remove the limit, or use a docker sandbox`,
      );
    }
    const lifetimeMs = (spec.lifetimeMs ?? runtime.timeout) + settings.timeoutMarginMs;
    const creating = client.Sandbox.create(template, {
      metadata: {
        ...(settings.prefix ? { [E2BMetadata.prefix]: settings.prefix } : {}),
        ...(settings.system ? { [E2BMetadata.system]: settings.system } : {}),
        ...(session
          ? { [E2BMetadata.session]: spec.jobId }
          : { [E2BMetadata.job]: spec.jobId, [E2BMetadata.attempt]: String(spec.attempt) }),
        [E2BMetadata.worker]: spec.workerId,
        [E2BMetadata.sandbox]: spec.id,
      },
      timeoutMs: lifetimeMs,
      allowInternetAccess,
    });
    let remote: E2BRemoteSandbox | undefined;
    try {
      remote = await raceAbort(creating, signal);
    } catch (err) {
      throw e2bError(err, `could not create an E2B sandbox from template ${template}`, { template });
    }
    if (!remote) {
      // Abandoned: the sandbox may still come into being; kill it as soon as it does.
      creating.then((late) => late.kill()).catch(() => {});
      signal?.throwIfAborted();
      throw new BoxcarError(ErrorCode.cancelled, "sandbox creation was abandoned");
    }
    const created = remote;
    try {
      const ready = await raceAbort(
        Promise.all([prepareWorkspace(created, settings.workspace), created.getInfo()]).catch((err: unknown) => {
          throw e2bError(err, `could not prepare E2B sandbox ${created.sandboxId}`);
        }),
        signal,
      );
      if (!ready) {
        signal?.throwIfAborted();
        throw new BoxcarError(ErrorCode.cancelled, "sandbox creation was abandoned");
      }
      const [workspace, info] = ready;
      const limits = templateLimits(template, runtime.limits, info);
      const sandbox = new E2BSandbox(spec.id, created, {
        workspace,
        agentPath: settings.agentPath,
        description: { image: template, network: runtime.network, limits },
        lifetimeMs,
        killGraceMs: settings.killGraceMs,
      });
      return { sandbox, remote: created };
    } catch (err) {
      await created.kill().catch(() => {});
      throw err;
    }
  }

  const { prefix, system } = settings;
  if (client) {
    // A new attempt kills its job's earlier attempts' sandboxes by id before its agent starts (a
    // frozen worker's, whose E2B timeout, the lease's stop time, has not come yet).
    provider.removeEarlierAttempts = async (jobId, attempt) => {
      let removed = 0;
      try {
        const query = { metadata: { [E2BMetadata.job]: jobId, ...(prefix ? { [E2BMetadata.prefix]: prefix } : {}) } };
        const pages = client.Sandbox.list({ query: { ...query, state: ["running", "paused"] } });
        while (pages.hasNext) {
          for (const info of await pages.nextItems()) {
            const theirs = info.metadata[E2BMetadata.system];
            if (theirs !== undefined && system !== undefined && theirs !== system) continue;
            if (Number(info.metadata[E2BMetadata.attempt]) >= attempt) continue;
            if (await client.Sandbox.kill(info.sandboxId)) removed += 1;
          }
        }
      } catch (err) {
        throw e2bError(err, `could not look for E2B sandboxes of job ${jobId}'s earlier attempts`);
      }
      return removed;
    };
  }
  if (client && prefix) {
    provider.reap = async (isOrphan) => {
      let removed = 0;
      try {
        const pages = client.Sandbox.list({ query: { metadata: { [E2BMetadata.prefix]: prefix }, state: ["running", "paused"] } });
        while (pages.hasNext) {
          for (const info of await pages.nextItems()) {
            // Another system's with the same prefix; one without the key is from an older worker.
            const theirs = info.metadata[E2BMetadata.system];
            if (theirs !== undefined && theirs !== system) continue;
            const owner = ownerOf(info.metadata);
            if (!owner || !(await isOrphan(owner))) continue;
            if (await client.Sandbox.kill(info.sandboxId)) removed += 1;
          }
        }
      } catch (err) {
        throw e2bError(err, "could not look for E2B sandboxes left by gone workers");
      }
      return removed;
    };
  }
  return provider;
}

interface E2BSandboxSettings {
  workspace: string;
  agentPath: string;
  description: { image: string; network: string; limits: ResourceLimits };
  lifetimeMs: number;

  killGraceMs: number;
}

/** One attempt's E2B sandbox (or a session's, which `E2BSession` wraps). */
class E2BSandbox implements Sandbox {
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

/** Makes the workspace folder; a relative one is resolved against the sandbox user's home by the sandbox. */
async function prepareWorkspace(remote: E2BRemoteSandbox, workspace: string): Promise<string> {
  await remote.files.makeDir(workspace);
  return posix.isAbsolute(workspace) ? posix.normalize(workspace).replace(/\/$/, "") : (await remote.files.getInfo(workspace)).path;
}

/**
 * The agent's network wish as E2B's internet switch: `none` (the default) is no internet,
 * `bridge` is E2B's usual internet access. E2B has no named networks.
 */
function internetAccess(network: string): boolean {
  if (network === "none") return false;
  if (network === "bridge") return true;
  throw new BoxcarError(
    ErrorCode.invalid,
    `runtime.network ${network} is not available in E2B sandboxes: use none (no internet) or bridge (internet access)`,
  );
}

/**
 * The CPU and memory a template gives its sandboxes (E2B fixes them per template, not per
 * sandbox). A wish below them cannot be enforced and is refused; one at or above them holds.
 */
function templateLimits(template: string, wish: ResourceLimits, info: { cpuCount?: number; memoryMB?: number }): ResourceLimits {
  const limits: ResourceLimits = {};
  if (info.cpuCount) limits.cpus = info.cpuCount;
  if (info.memoryMB) limits.memory = info.memoryMB * 1024 * 1024;
  const refuse = (what: string, wanted: string, has: string) =>
    new BoxcarError(
      ErrorCode.invalid,
      `runtime.limits.${what} is ${wanted}, but E2B template ${template} gives its sandboxes ${has} and E2B cannot set less for one sandbox: use a template built with less, or raise or remove the limit`,
    );
  if (wish.cpus !== undefined && limits.cpus !== undefined && wish.cpus < limits.cpus) {
    throw refuse("cpus", String(wish.cpus), `${limits.cpus} CPUs`);
  }
  if (wish.memory !== undefined && limits.memory !== undefined && wish.memory < limits.memory) {
    throw refuse("memory", `${wish.memory} bytes`, `${limits.memory} bytes`);
  }
  return limits;
}

/** Whose a sandbox is, by its metadata: a session's is its worker's for as long as that worker lives (as a warm container is). */
function ownerOf(metadata: Record<string, string>): SandboxOwner | undefined {
  const jobId = metadata[E2BMetadata.job];
  const workerId = metadata[E2BMetadata.worker];
  if (metadata[E2BMetadata.session] !== undefined) return workerId ? { workerId } : undefined;
  const attempt = Number(metadata[E2BMetadata.attempt]);
  return jobId && workerId && Number.isInteger(attempt) ? { jobId, workerId, attempt } : undefined;
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
