/**
 * One job attempt's Docker container (`DockerSandbox`): created cold for the job, or a warm one
 * taken from the pool; the agent run in it with its output streamed, its lifeline on stdin, its
 * resource use sampled and a bind-mounted workspace watched against its quota; the workspace
 * copied in and back out when it is not bind-mounted; and the container removed when the
 * attempt ends. The Docker provider (docker-sandbox.ts) makes these.
 */

import { PassThrough } from "node:stream";
import { BoxcarError, ErrorCode, type ResourceLimits } from "@boxcar/protocol";
import type Docker from "dockerode";
import { LocalFilesSandbox, type LocalWorkspace, type WorkspaceRoot } from "../../workspace/local-workspace.js";
import { packFolder, unpackInto } from "../../workspace/workspace-archive.js";
import { WorkspaceQuota } from "../../workspace/workspace-quota.js";
import { raceAbort } from "../abort.js";
import { beatLine, underLifeline } from "../lifeline.js";
import type { ExecOptions, ExecResult, Sandbox, SandboxSpec } from "../sandbox.js";
import { attachWhole } from "./attached-container.js";
import { CONTAINER_WORKSPACE, ContainerLabel, containerLabels, hardenedHostConfig } from "./container-config.js";
import { readInContainer, writeInContainer } from "./container-files.js";
import { ignoreGone, isMissingBindSource, isMissingImage } from "./engine.js";
import { USAGE_AFTER_MS, UsageMeter } from "./usage-meter.js";
import type { WarmContainer } from "./warm-pool.js";
import { giveTo, type WorkspaceMounting } from "./workspace-mounting.js";

/** What a job's container is made with: the provider's settings and what it chose for the job's runtime (`settingsFor` in docker-sandbox.ts). */
export interface ContainerSettings {
  root: WorkspaceRoot;
  owner: { uid: number; gid: number };
  mounting: WorkspaceMounting;
  bindRefused: () => void;
  image: string;
  network: string;
  limits: { cpus: number; memory: number; pids: number };
  user: string;
  tmpBytes: number;
  maxWorkspaceBytes: number;
  maxWorkspaceEntries: number;
  prefix: string;
  system: string | undefined;
  agentPath: string;
  /** Called when a warm container is removed: no longer this worker's to keep. */
  forget: (sandboxId: string) => void;
  /** Called when the engine no longer has the image: it is looked up (or pulled) again. */
  imageGone: () => Promise<void>;
}

export class DockerSandbox extends LocalFilesSandbox implements Sandbox {
  readonly kind = "docker";
  readonly workspace = CONTAINER_WORKSPACE;
  readonly id: string;
  readonly agentPath: string;
  readonly description: { image: string; network: string; limits: ResourceLimits; start: "warm_hit" | "cold" };
  private container: Docker.Container | undefined;
  /** The container being created: an abort stops waiting for it, and destroy() removes it once made. */
  private creating: Promise<Docker.Container> | undefined;
  private destroyed: Promise<void> | undefined;
  /**
   * The container whose workspace is a copy (not the staged folder), from when the agent starts
   * until its workspace is copied back out: the agent's files are read and written there
   * meanwhile (its usage file, its signals). Undefined otherwise; a promise while it starts.
   */
  private inContainer: Promise<Docker.Container | undefined> = Promise.resolve(undefined);

  /** The staged folder, when it is the container's workspace (bind-mounted): not when it is copied in. */
  get localFolder(): string | undefined {
    return this.warm || this.settings.mounting === "bind" ? this.files.dir : undefined;
  }

  constructor(
    private readonly docker: Docker,
    private readonly spec: SandboxSpec,
    private readonly settings: ContainerSettings,
    files: LocalWorkspace,
    /** A container from the warm pool, already started, waiting for this job. */
    private readonly warm?: WarmContainer,
  ) {
    super(files);
    this.id = spec.id;
    this.agentPath = settings.agentPath;
    this.description = { image: settings.image, network: settings.network, limits: settings.limits, start: warm ? "warm_hit" : "cold" };
  }

  /**
   * Runs the agent. Cold: the container is created with `argv`, the staged workspace copied in
   * (unless bind-mounted), started, and waited for; then the workspace is copied back out. Warm:
   * the ready container gets the job's limits (if not its own) and the job's script, and its
   * helper reports how the agent ended.
   */
  async exec(argv: string[], opts: ExecOptions): Promise<ExecResult> {
    if (this.container) throw new BoxcarError(ErrorCode.sandboxFailed, `sandbox ${this.id} has already run its command`);
    if (this.destroyed) throw new BoxcarError(ErrorCode.sandboxFailed, `sandbox ${this.id} is destroyed`);
    const notRun: ExecResult = { exitCode: null, signal: null, aborted: true, durationMs: 0 };
    const { owner } = this.settings;
    if ((this.warm || this.settings.mounting === "bind") && process.getuid?.() !== owner.uid) await giveTo(this.files.dir, owner);
    let begun: (container: Docker.Container | undefined) => void = () => {};
    this.inContainer = new Promise((resolve) => (begun = resolve));
    const started = await (this.warm ? this.startWarm(this.warm, argv, opts) : this.startCold(argv, opts)).catch((err: unknown) => {
      begun(undefined);
      throw err;
    });
    begun(started && !started.bind ? started.container : undefined);
    if (!started) return notRun;
    // Whether the staged folder is the container's workspace: a refused bind mount copies instead.
    const { container, exited, startedAt, bind } = started;

    const usage = new UsageMeter();
    let aborted = false;
    const onAbort = () => {
      aborted = true;
      container.kill({ signal: "SIGKILL" }).catch(ignoreGone);
    };
    // The engine samples about once a second: a shorter run is not worth a stats stream.
    const sampling = setTimeout(() => void usage.follow(container), USAGE_AFTER_MS);
    // A bind-mounted workspace is written straight to the worker's disk: watched while the agent
    // runs, and measured once more when it has ended (a copied one is bounded when copied out).
    const limits = { maxBytes: this.settings.maxWorkspaceBytes, maxEntries: this.settings.maxWorkspaceEntries };
    let breach: string | undefined;
    let killedForQuota = false;
    const quota = bind
      ? new WorkspaceQuota(this.files.dir, limits, (reason) => {
          breach = `${reason}: the agent was killed`;
          killedForQuota = true;
          container.kill({ signal: "SIGKILL" }).catch(ignoreGone);
        })
      : undefined;
    opts.signal.addEventListener("abort", onAbort, { once: true });
    if (opts.signal.aborted) onAbort();
    let exit: AgentExit;
    try {
      exit = await exited;
    } finally {
      clearTimeout(sampling);
      quota?.stop();
      opts.signal.removeEventListener("abort", onAbort);
    }
    const durationMs = performance.now() - startedAt;
    if (quota && breach === undefined && !opts.signal.aborted) {
      const last = await quota.lastLook();
      if (last) breach = `${last} by the time the agent ended`;
    }
    // Only a SIGKILL (128 + 9) this worker did not send can be the kernel's OOM killer.
    const oomKilled = exit.code === 137 && !aborted && !killedForQuota && (await exit.oomKilled());
    // A timeout or cancel while the workspace is copied out stops the copy too: the run is then
    // as stopped as one killed while it ran (a workspace of many files took longer than the job).
    const killed = aborted || oomKilled || killedForQuota;
    if (!bind && !opts.signal.aborted) {
      await this.copyOut(container, opts.signal).catch((err: unknown) => {
        if (!opts.signal.aborted) throw err;
      });
      // Copied out: the staged folder is the workspace again. (A stopped run's is not copied, and
      // stays the container's: its usage file is read from there.)
      if (!opts.signal.aborted) this.inContainer = Promise.resolve(undefined);
    }
    return {
      exitCode: killed ? null : exit.code,
      signal: killed ? "SIGKILL" : null,
      aborted: aborted || opts.signal.aborted,
      durationMs,
      oomKilled,
      ...(breach !== undefined ? { breach } : {}),
      ...(usage.result() ? { usage: usage.result() } : {}),
    };
  }

  /** Creates (copying the workspace in, unless bind-mounted), attaches and starts the container; undefined when aborted first. */
  private async startCold(argv: string[], opts: ExecOptions): Promise<StartedAgent | undefined> {
    // Until the agent starts, an abort simply stops waiting: destroy() removes what was made.
    const untilAborted = <T>(step: Promise<T>) => raceAbort(step, opts.signal);
    let bind = this.settings.mounting === "bind";
    let imageLookedUp = false;
    const create = async (): Promise<Docker.Container> => {
      try {
        return await this.createContainer(underLifeline(argv, "stdin", opts.attemptLease?.msLeft()), opts.env, bind);
      } catch (err) {
        // Removed since this worker last saw it: looked up (or pulled) again, once.
        if (isMissingImage(err) && !imageLookedUp) {
          imageLookedUp = true;
          await this.settings.imageGone();
          return create();
        }
        // The engine cannot see the folder: copies, from now on.
        if (bind && isMissingBindSource(err)) {
          this.settings.bindRefused();
          bind = false;
          return create();
        }
        throw err;
      }
    };
    this.creating = create();
    const container = await untilAborted(this.creating);
    if (!container) return undefined;
    this.container = container;
    if (
      !bind &&
      !(await untilAborted(container.putArchive(packFolder(this.files.dir, this.settings.owner), { path: CONTAINER_WORKSPACE })))
    ) {
      return undefined;
    }
    const output = await untilAborted(this.attach(container, opts));
    if (!output) return undefined;
    const startedAt = performance.now();
    if (!(await untilAborted(container.start().then(() => true)))) return undefined;
    const exited = container.wait().then(async (status: { StatusCode: number }) => {
      await output.ended;
      return { code: status.StatusCode, oomKilled: async () => (await container.inspect()).State.OOMKilled };
    });
    return { container, exited, startedAt, bind };
  }

  /**
   * Gives the job to a warm container: its limits first where the job's differ from those it was
   * made with, then the script. The helper's report of the agent's exit ends the run without
   * waiting for the engine to notice; the container is then killed and waited for, so nothing
   * of the agent runs on while its results are read (the report is the agent's own word).
   * Without a report (the shell was killed too), the exit is the engine's.
   */
  private async startWarm(warm: WarmContainer, argv: string[], opts: ExecOptions): Promise<StartedAgent | undefined> {
    const { container } = warm;
    this.container = container;
    const { limits } = this.settings;
    if (limits.cpus !== warm.limits.cpus || limits.memory !== warm.limits.memory || limits.pids !== warm.limits.pids) {
      const update = { Memory: limits.memory, MemorySwap: limits.memory, NanoCpus: Math.round(limits.cpus * 1e9), PidsLimit: limits.pids };
      if (
        !(await raceAbort(
          container.update(update).then(() => true),
          opts.signal,
        ))
      )
        return undefined;
    }
    if (opts.signal.aborted) return undefined;
    const startedAt = performance.now();
    const run = warm.run(argv, opts.env, opts.onOutput, opts.attemptLease);
    const exited = run.report.then(async (report): Promise<AgentExit> => {
      if (report) await container.kill({ signal: "SIGKILL" }).catch(ignoreGone);
      const status = (await container.wait()) as { StatusCode: number };
      return { code: report?.exitCode ?? status.StatusCode, oomKilled: async () => (await container.inspect()).State.OOMKilled };
    });
    return { container, exited, startedAt, bind: true };
  }

  /**
   * `bind`: the staged folder is the container's workspace; else an anonymous volume the workspace
   * is copied into. Its stdin is the lifeline (`argv` runs under one): this worker's attached
   * stream, closed by the engine when the worker's connection ends (`StdinOnce`).
   */
  private createContainer(argv: string[], env: Record<string, string>, bind: boolean): Promise<Docker.Container> {
    const { spec, settings } = this;
    return this.docker.createContainer({
      name: `boxcar-${spec.id}`,
      Image: settings.image,
      Cmd: argv,
      Entrypoint: [],
      Env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
      WorkingDir: CONTAINER_WORKSPACE,
      User: settings.user,
      AttachStdout: true,
      AttachStderr: true,
      AttachStdin: true,
      OpenStdin: true,
      StdinOnce: true,
      Labels: containerLabels(settings, spec.workerId, spec.id, {
        [ContainerLabel.job]: spec.jobId,
        [ContainerLabel.attempt]: String(spec.attempt),
      }),
      HostConfig: hardenedHostConfig(settings, bind ? this.files.dir : undefined),
    });
  }

  /**
   * Streams the container's output to `onOutput`; `ended` resolves when the output ends. Its stdin
   * is the agent's lifeline: it beats with the attempt's lease until then.
   */
  private async attach(container: Docker.Container, opts: ExecOptions): Promise<{ ended: Promise<void> }> {
    const stream = await attachWhole(container);
    const stopBeating = opts.attemptLease?.onRenewed((msLeft) => stream.write(beatLine(msLeft)));
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    stdout.on("data", (chunk: Buffer) => opts.onOutput("stdout", chunk));
    stderr.on("data", (chunk: Buffer) => opts.onOutput("stderr", chunk));
    this.docker.modem.demuxStream(stream, stdout, stderr);
    const ended = new Promise<void>((resolve) => {
      stream.once("end", resolve);
      stream.once("close", resolve);
      stream.once("error", () => resolve());
    });
    void ended.then(() => stopBeating?.());
    return { ended };
  }

  override async readFile(path: string): Promise<ReadableStream<Uint8Array> | null> {
    const container = await this.inContainer;
    return container ? readInContainer(container, `${CONTAINER_WORKSPACE}/${path}`) : super.readFile(path);
  }

  override async writeFile(path: string, data: Uint8Array | ReadableStream<Uint8Array>): Promise<void> {
    const container = await this.inContainer;
    if (!container) return super.writeFile(path, data);
    await writeInContainer(container, path, data, this.settings.owner);
  }

  /** Replaces the staged workspace with the container's, for reading results and artifacts; `signal` stops it. */
  private async copyOut(container: Docker.Container, signal: AbortSignal): Promise<void> {
    const fresh = await this.settings.root.create({ workerId: this.spec.workerId, sandboxId: this.id });
    try {
      const archive = await container.getArchive({ path: `${CONTAINER_WORKSPACE}/.` });
      await unpackInto(archive, fresh, {
        maxBytes: this.settings.maxWorkspaceBytes,
        maxEntries: this.settings.maxWorkspaceEntries,
        signal,
      });
    } catch (err) {
      await fresh.remove();
      throw err;
    }
    await this.files.remove();
    this.files = fresh;
  }

  destroy(): Promise<void> {
    this.destroyed ??= (async () => {
      const container = this.container ?? this.warm?.container ?? (await this.creating?.catch(() => undefined));
      await container?.remove({ force: true, v: true }).catch(ignoreGone);
      await this.files.remove();
      if (this.warm) this.settings.forget(this.warm.sandboxId);
    })();
    return this.destroyed;
  }
}

/** A started agent: its container, how it ended once it has, and when it started. */
interface StartedAgent {
  container: Docker.Container;
  /** The workspace is the staged folder, bind-mounted (else a copy in the container's volume). */
  bind: boolean;
  exited: Promise<AgentExit>;
  startedAt: number;
}

/** How an agent ended: its exit code, and (asked only for a SIGKILL) whether the kernel killed it for memory. */
interface AgentExit {
  code: number;
  oomKilled: () => Promise<boolean>;
}
