import { randomBytes } from "node:crypto";
import { lchown, readdir } from "node:fs/promises";
import { hostname } from "node:os";
import { join } from "node:path";
import { PassThrough, Readable } from "node:stream";
import { BoxcarError, ErrorCode, type ResourceLimits, type ResourceUsage } from "@boxcar/protocol";
import Docker from "dockerode";
import tar from "tar-stream";
import { LocalFilesSandbox, type LocalWorkspace, WorkspaceRoot } from "../../workspace/local-workspace.js";
import { defaultWorkRoot } from "../../workspace/work-root.js";
import { type ArchiveOwner, packFolder, unpackInto } from "../../workspace/workspace-archive.js";
import { WorkspaceQuota } from "../../workspace/workspace-quota.js";
import { raceAbort } from "../abort.js";
import { beatLine, underLifeline } from "../lifeline.js";
import type { ExecOptions, ExecResult, Sandbox, SandboxOwner, SandboxProvider, SandboxSpec } from "../sandbox.js";
import { attachWhole } from "./attached-container.js";
import { DockerSession } from "./docker-session.js";
import { WarmContainer, type WarmKey, type WarmMaker, WarmPool } from "./warm-pool.js";

export interface DockerSandboxOptions {
  /** Labels name this system's containers, so several Boxcar systems can share one engine. */
  prefix: string;
  /**
   * The system's identity (`Topology.systemId`), also a label: the reaper leaves alone the
   * containers of another system with the same prefix. Without it, every container of the prefix is judged.
   */
  system?: string;
  /** The engine; default: `DOCKER_HOST`, else the local socket. */
  docker?: Docker;
  /** Image for agents that name none; default `boxcar-agent:latest` (Dockerfile.agent). */
  defaultImage?: string;
  /** The agent's user inside the container; default `1000:1000`, never root. */
  user?: string;
  /** Limits for agents that set none: default 1 CPU, 1 GiB, 256 processes. */
  defaultLimits?: { cpus: number; memory: number; pids: number };
  /** Size of the `/tmp` tmpfs; default 64 MiB. */
  tmpBytes?: number;
  /** Most data in a workspace: watched while a bind-mounted one is written, checked as a copied one comes out; default 1 GiB. */
  maxWorkspaceBytes?: number;
  /** Most files and folders in a workspace, the same two ways; default 100 000. */
  maxWorkspaceEntries?: number;
  /** Where workspaces are staged on this machine; default {@link defaultWorkRoot}. */
  root?: string;
  /** Registry credentials for an image, passed with that pull only (never written to a config). */
  registryAuth?: (image: string) => Docker.AuthConfig | undefined;
  /**
   * How a job's workspace reaches its container: `bind` mounts the job's folder under `root`
   * (no copies), `copy` copies it into an anonymous volume and back out. Default `auto`: `bind`
   * when the engine can see this machine's folders (see {@link WorkspaceMounting}), else `copy`.
   */
  workspace?: "auto" | "bind" | "copy";
  /**
   * Containers kept started and ready for each (image, network) that agents asking for
   * `runtime.warm` use, each taken by one job (docs/docker.md); default 0: none. Only with
   * bind-mounted workspaces.
   */
  warm?: number;
}

/** How a job's workspace reaches its container (docs/docker.md). */
export type WorkspaceMounting = "bind" | "copy";

/** Where the workspace is inside every container. */
export const CONTAINER_WORKSPACE = "/workspace";

/** Label keys on every container Boxcar creates. */
export const ContainerLabel = {
  prefix: "boxcar.prefix",
  system: "boxcar.system",
  job: "boxcar.job",
  attempt: "boxcar.attempt",
  worker: "boxcar.worker",
  sandbox: "boxcar.sandbox",
  /** On a warm container: made before its job was known (its name says the job once one took it). */
  warm: "boxcar.warm",
  /** On a session's container: the session it is kept for. */
  session: "boxcar.session",
} as const;

/**
 * Sandboxes that are Docker containers, hardened by default: no network unless the agent asks,
 * read-only root filesystem with a writable workspace volume and a size-limited `/tmp`, a
 * non-root user, no capabilities, no-new-privileges, memory (without extra swap), CPU and
 * process limits, an init process, no engine socket inside, and no log kept by the engine.
 */
export function createDockerSandboxProvider(opts: DockerSandboxOptions): SandboxProvider {
  const docker = opts.docker ?? new Docker();
  const settings = {
    defaultImage: opts.defaultImage ?? "boxcar-agent:latest",
    user: opts.user ?? "1000:1000",
    defaultLimits: opts.defaultLimits ?? { cpus: 1, memory: 1024 ** 3, pids: 256 },
    tmpBytes: opts.tmpBytes ?? 64 * 1024 ** 2,
    maxWorkspaceBytes: opts.maxWorkspaceBytes ?? 1024 ** 3,
    maxWorkspaceEntries: opts.maxWorkspaceEntries ?? 100_000,
    root: new WorkspaceRoot(opts.root ?? defaultWorkRoot(), opts.system),
  };
  const [uid, gid] = settings.user.split(":").map(Number);
  const owner = { uid: uid ?? 1000, gid: gid ?? uid ?? 1000 };
  let pool: WarmPool | undefined;
  let maker: WarmMaker | undefined;
  /** The PATH of each image already on the engine: looked up (or pulled) once, not for every job. */
  const imagePaths = new Map<string, string>();
  const imagePath = async (image: string, signal?: AbortSignal): Promise<string> => {
    const known = imagePaths.get(image);
    if (known !== undefined) return known;
    const path = await ensureImage(docker, image, opts.registryAuth?.(image), signal);
    imagePaths.set(image, path);
    return path;
  };
  let workerId: string | undefined;
  /** The warm containers this worker made and has not removed yet. */
  const ownWarm = new Set<string>();
  /** The containers of sessions this worker holds (by sandbox id). */
  const ownSessions = new Set<string>();
  /** Removes this system's containers (matching `filters` too) whose owner `doomed` names. */
  async function removeOwn(
    doomed: (owner: SandboxOwner) => Promise<boolean>,
    filters: { label?: string[]; name?: string[] } = {},
  ): Promise<number> {
    const labels = [`${ContainerLabel.prefix}=${opts.prefix}`, ...(filters.label ?? [])];
    const containers = await docker.listContainers({ all: true, filters: { ...filters, label: labels } });
    let removed = 0;
    for (const info of containers) {
      // Another system's with the same prefix (its workers are not in this system's presence
      // list, so they would all look gone). A container without the label is from a worker of
      // a release before it, and is judged as before.
      const system = info.Labels[ContainerLabel.system];
      if (system !== undefined && system !== opts.system) continue;
      const owner = ownerOf(info);
      if (!owner) continue;
      // This worker's own warm or session container: left by an earlier run under the same id, or still in use here.
      const mine = owner.workerId === workerId && owner.jobId === undefined;
      const sandbox = info.Labels[ContainerLabel.sandbox] ?? "";
      if (mine ? ownWarm.has(sandbox) || ownSessions.has(sandbox) : !(await doomed(owner))) continue;
      await docker
        .getContainer(info.Id)
        .remove({ force: true, v: true })
        .then(() => (removed += 1), ignoreGone);
    }
    return removed;
  }
  let engineCpus: number | undefined;
  let self: Promise<Docker.ContainerInspectInfo | undefined> | undefined;
  const ownContainer = () => {
    self ??= selfContainer(docker);
    return self;
  };
  let mounting: Promise<WorkspaceMounting> | undefined;
  const chooseMounting = async (): Promise<WorkspaceMounting> => {
    if (opts.workspace === "bind" || opts.workspace === "copy") return opts.workspace;
    if (!(await bindable(docker, owner))) return "copy";
    const self = await ownContainer();
    return !self || sharesFolder(self, await settings.root.realPath()) ? "bind" : "copy";
  };
  /** Decided once; an engine that did not answer is asked again next time. */
  const decideMounting = () => {
    mounting ??= chooseMounting().catch((err: unknown) => {
      mounting = undefined;
      throw err;
    });
    return mounting;
  };

  /**
   * A ready container for `spec`'s job, named after it before anything of the job reaches it
   * (so the job's next attempt finds it should this worker die); undefined when none is ready or
   * the engine would not rename it (that one is removed; the job runs cold).
   */
  const takeWarm = async (spec: SandboxSpec, key: WarmKey): Promise<WarmContainer | undefined> => {
    const warm = pool?.take(key);
    if (!warm) return undefined;
    try {
      await warm.container.rename({ name: takenName(spec, warm) });
      return warm;
    } catch {
      await maker?.discard(warm).catch(() => undefined);
      return undefined;
    }
  };
  /** Makes and removes `workerId`'s warm containers: hardened as a cold one, with the default limits and a folder of their own. */
  const warmMaker = (workerId: string): WarmMaker => ({
    make: async ({ image, network }) => {
      const agentPath = await imagePath(image);
      const sandboxId = `warm-${randomBytes(6).toString("hex")}`;
      ownWarm.add(sandboxId);
      const files = await settings.root.create({ workerId, sandboxId });
      try {
        const confinement = { network, limits: settings.defaultLimits, tmpBytes: settings.tmpBytes };
        const options = {
          name: `boxcar-${sandboxId}`,
          Image: image,
          WorkingDir: CONTAINER_WORKSPACE,
          User: settings.user,
          Labels: containerLabels(opts, workerId, sandboxId, { [ContainerLabel.warm]: "1" }),
          HostConfig: hardenedHostConfig(confinement, files.dir),
        };
        return await WarmContainer.start(docker, sandboxId, options, files, settings.defaultLimits, agentPath);
      } catch (err) {
        ownWarm.delete(sandboxId);
        await files.remove();
        // Looked up (or pulled) again for the next container, or the next job.
        if (isMissingImage(err)) imagePaths.delete(image);
        throw err;
      }
    },
    discard: async (warm) => {
      await warm.container.remove({ force: true, v: true }).catch(ignoreGone);
      await warm.files.remove();
      ownWarm.delete(warm.sandboxId);
    },
  });

  /** What a container for `runtime` runs with: image, limits (within the engine's CPUs), network, and how its workspace gets in. */
  const settingsFor = async (runtime: SandboxSpec["runtime"], signal?: AbortSignal) => {
    const image = runtime.image ?? settings.defaultImage;
    const limits = {
      cpus: runtime.limits.cpus ?? settings.defaultLimits.cpus,
      memory: runtime.limits.memory ?? settings.defaultLimits.memory,
      pids: runtime.limits.pids ?? settings.defaultLimits.pids,
    };
    engineCpus ??= (await docker.info()).NCPU as number;
    if (limits.cpus > (engineCpus ?? Number.POSITIVE_INFINITY)) {
      throw new BoxcarError(
        ErrorCode.invalid,
        `runtime.limits.cpus is ${limits.cpus}, more than the ${engineCpus} CPUs of this Docker engine`,
      );
    }
    const network = await checkNetwork(docker, runtime.network, networksOf(await ownContainer()));
    return {
      ...settings,
      owner,
      image,
      network,
      limits,
      prefix: opts.prefix,
      system: opts.system,
      mounting: await decideMounting(),
      // The engine could not find the folder (a worker in a container of another engine, say): copy from now on.
      bindRefused: () => {
        mounting = Promise.resolve("copy");
      },
      forget: (sandboxId: string) => ownWarm.delete(sandboxId),
      imageGone: async () => {
        imagePaths.delete(image);
        await imagePath(image, signal);
      },
    };
  };

  return {
    kind: "docker",
    async available() {
      try {
        await docker.ping();
        return true;
      } catch {
        return false;
      }
    },

    async create(spec, signal) {
      const containerSettings = await settingsFor(spec.runtime, signal);
      const { image, network } = containerSettings;
      const warm = spec.runtime.warm && containerSettings.mounting === "bind" ? await takeWarm(spec, { image, network }) : undefined;
      if (warm) return new DockerSandbox(docker, spec, { ...containerSettings, agentPath: warm.agentPath }, warm.files, warm);
      const agentPath = await imagePath(image, signal);
      signal?.throwIfAborted();
      const files = await settings.root.create({ workerId: spec.workerId, sandboxId: spec.id });
      return new DockerSandbox(docker, spec, { ...containerSettings, agentPath }, files);
    },

    async createSession(spec, seed) {
      const container = await settingsFor(spec.runtime);
      if (container.mounting !== "bind") {
        throw new BoxcarError(
          ErrorCode.noSandbox,
          "Docker sessions need the workspace bind-mounted, and this worker copies workspaces into containers (docs/docker.md#how-the-workspace-reaches-the-container)",
        );
      }
      const agentPath = await imagePath(container.image);
      const files = await settings.root.create({ workerId: spec.workerId, sandboxId: spec.id });
      ownSessions.add(spec.id);
      try {
        // Filled and given to the agent's user before the container starts: nothing runs in it yet.
        if (seed) {
          await seed(files);
          if (process.getuid?.() !== owner.uid) await giveTo(files.dir, owner);
        }
        const session = await DockerSession.start(
          docker,
          {
            id: spec.id,
            create: {
              name: `boxcar-${spec.id}`,
              Image: container.image,
              WorkingDir: CONTAINER_WORKSPACE,
              User: settings.user,
              Labels: containerLabels(opts, spec.workerId, spec.id, { [ContainerLabel.session]: spec.jobId }),
              HostConfig: hardenedHostConfig(container, files.dir),
            },
            description: { image: container.image, network: container.network, limits: container.limits },
            agentPath,
            owner,
            quota: { maxBytes: settings.maxWorkspaceBytes, maxEntries: settings.maxWorkspaceEntries },
            // Its own until removed: the reaper must not race the session's close to remove it.
            destroyed: () => ownSessions.delete(spec.id),
          },
          files,
        );
        return session;
      } catch (err) {
        ownSessions.delete(spec.id);
        await files.remove();
        throw err;
      }
    },

    prepare(id, onError) {
      workerId = id;
      if (!opts.warm || pool) return;
      maker = warmMaker(id);
      const made = new WarmPool(maker, opts.warm, onError);
      pool = made;
      // The default image without a network is what most agents use: ready before the first job.
      void decideMounting().then((how) => how === "bind" && made.fill({ image: settings.defaultImage, network: "none" }), onError);
    },

    warmReady(kind) {
      if (!pool) return 0;
      return kind ? pool.readyFor({ image: kind.image ?? settings.defaultImage, network: kind.network ?? "none" }) : pool.readyCount;
    },

    async close() {
      await pool?.close();
    },

    reap(isOrphan) {
      return removeOwn(isOrphan);
    },

    async removeEarlierAttempts(jobId, attempt) {
      const earlier = async (owner: SandboxOwner) => owner.jobId === jobId && (owner.attempt ?? 0) < attempt;
      // Cold containers say their job in a label; warm ones in the name they got when taken.
      const cold = await removeOwn(earlier, { label: [`${ContainerLabel.job}=${jobId}`] });
      return cold + (await removeOwn(earlier, { label: [ContainerLabel.warm], name: [`boxcar-${jobId}.`] }));
    },
  };
}

/** The labels every container of this system carries (its prefix, system, worker and sandbox), and `more`. */
function containerLabels(
  owner: { prefix: string; system?: string | undefined },
  workerId: string,
  sandboxId: string,
  more: Record<string, string>,
): Record<string, string> {
  return {
    [ContainerLabel.prefix]: owner.prefix,
    ...(owner.system ? { [ContainerLabel.system]: owner.system } : {}),
    [ContainerLabel.worker]: workerId,
    [ContainerLabel.sandbox]: sandboxId,
    ...more,
  };
}

/** What a container's confinement depends on. */
export interface Confinement {
  network: string;
  limits: { cpus: number; memory: number; pids: number };
  tmpBytes: number;
}

/**
 * The host configuration of every job container: no capabilities, no new privileges, read-only
 * root with a workspace volume and a size-limited `/tmp`, limits, init, no engine log.
 */
export function hardenedHostConfig(c: Confinement, workspace?: string): Docker.HostConfig {
  return {
    NetworkMode: c.network,
    ReadonlyRootfs: true,
    // The job's folder on this machine, or an anonymous volume (removed with the container):
    // writable under a read-only root.
    Mounts: [
      workspace
        ? { Type: "bind", Source: workspace, Target: CONTAINER_WORKSPACE }
        : { Type: "volume", Source: "", Target: CONTAINER_WORKSPACE },
    ],
    Tmpfs: { "/tmp": `rw,nosuid,nodev,size=${c.tmpBytes}` },
    CapDrop: ["ALL"],
    SecurityOpt: ["no-new-privileges"],
    Init: true,
    Memory: c.limits.memory,
    MemorySwap: c.limits.memory,
    NanoCpus: Math.round(c.limits.cpus * 1e9),
    PidsLimit: c.limits.pids,
    LogConfig: { Type: "none", Config: {} },
  };
}

interface ContainerSettings {
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

class DockerSandbox extends LocalFilesSandbox implements Sandbox {
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

/** A file of a container's, as a stream (null when there is none, or it is no file). */
async function readInContainer(container: Docker.Container, path: string): Promise<ReadableStream<Uint8Array> | null> {
  let archive: NodeJS.ReadableStream;
  try {
    archive = await container.getArchive({ path });
  } catch (err) {
    if (statusOf(err) === 404) return null;
    throw err;
  }
  const extract = tar.extract();
  const file = new PassThrough();
  let found = false;
  extract.on("entry", (header, entry, next) => {
    entry.on("end", next);
    if (found || header.type !== "file") return entry.resume();
    found = true;
    entry.pipe(file);
  });
  extract.on("finish", () => file.end());
  extract.on("error", (err) => file.destroy(err));
  // A reader that stops early (past its limit) stops the archive too.
  file.on("close", () => (archive as NodeJS.ReadableStream & { destroy?: () => void }).destroy?.());
  archive.pipe(extract);
  const head = await new Promise<boolean>((resolve) => {
    extract.once("entry", (header) => resolve(header.type === "file"));
    extract.once("finish", () => resolve(false));
    extract.once("error", () => resolve(true));
  });
  return head ? (Readable.toWeb(file) as ReadableStream<Uint8Array>) : null;
}

/** Writes a file into a container's workspace (its folders made), owned by the agent's user. */
async function writeInContainer(
  container: Docker.Container,
  path: string,
  data: Uint8Array | ReadableStream<Uint8Array>,
  owner: ArchiveOwner,
): Promise<void> {
  const body = data instanceof Uint8Array ? data : new Uint8Array(await new Response(data).arrayBuffer());
  const pack = tar.pack();
  const parts = path.split("/");
  for (let i = 1; i < parts.length; i++) {
    pack.entry({ name: `${parts.slice(0, i).join("/")}/`, type: "directory", mode: 0o755, uid: owner.uid, gid: owner.gid });
  }
  pack.entry({ name: path, type: "file", mode: 0o644, uid: owner.uid, gid: owner.gid }, Buffer.from(body));
  pack.finalize();
  await container.putArchive(pack, { path: CONTAINER_WORKSPACE });
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

/**
 * The network mode for an agent's wish: `none` (default), `bridge`, or an existing network, but
 * never the worker's own (`host`, another container's, or a network the worker's container is
 * on: the one NATS and the roles use).
 */
async function checkNetwork(docker: Docker, wish: string, own: ReadonlySet<string>): Promise<string> {
  if (wish === "none" || wish === "bridge") return wish;
  if (wish === "host" || wish.startsWith("container:")) {
    throw new BoxcarError(ErrorCode.invalid, `runtime.network ${wish} is not allowed: it would share the worker's network`);
  }
  let found: { Id: string; Name: string };
  try {
    found = await docker.getNetwork(wish).inspect();
  } catch (err) {
    if (statusOf(err) === 404) throw new BoxcarError(ErrorCode.invalid, `runtime.network: there is no Docker network named ${wish}`);
    throw err;
  }
  if (own.has(found.Id) || own.has(found.Name)) {
    throw new BoxcarError(
      ErrorCode.invalid,
      `runtime.network ${wish} is not allowed: the worker itself is on it (agents never join the system's networks)`,
    );
  }
  return wish;
}

/** The worker's own container on this engine; undefined when it is not in one. */
async function selfContainer(docker: Docker): Promise<Docker.ContainerInspectInfo | undefined> {
  try {
    return await docker.getContainer(hostname()).inspect();
  } catch {
    return undefined;
  }
}

/** The ids and names of the networks a container is on. */
function networksOf(container: Docker.ContainerInspectInfo | undefined): Set<string> {
  const networks = container?.NetworkSettings?.Networks ?? {};
  return new Set(Object.entries(networks).flatMap(([name, n]) => [name, n.NetworkID]));
}

/**
 * Whether a folder of this machine can be bind-mounted as an agent's workspace: the engine is
 * reached through a local socket, maps no users (rootless or `userns-remap` would give the
 * folder to another uid), and this worker can give the folder to the agent's user (it is root,
 * or that user). The worker must also not be in a container of this engine (checked apart):
 * its folders are not the engine's.
 */
async function bindable(docker: Docker, owner: { uid: number }): Promise<boolean> {
  if (!(docker.modem as { socketPath?: unknown }).socketPath) return false;
  const uid = process.getuid?.();
  if (uid !== 0 && uid !== owner.uid) return false;
  const info = (await docker.info()) as { SecurityOptions?: string[] };
  return !(info.SecurityOptions ?? []).some((o) => o.includes("name=rootless") || o.includes("name=userns"));
}

/**
 * Whether a worker in container `self` has `folder` at the same path as the engine's machine: it
 * lies in a bind mount whose source and target are the same path (`-v /srv/boxcar:/srv/boxcar`),
 * so a workspace made there can be bind-mounted into a job container by that path.
 */
export function sharesFolder(self: Pick<Docker.ContainerInspectInfo, "Mounts">, folder: string): boolean {
  const trimmed = (path: string) => (path.length > 1 ? path.replace(/\/+$/, "") : path);
  const inside = (m: { Destination: string }) => {
    const target = trimmed(m.Destination);
    return folder === target || folder.startsWith(target === "/" ? "/" : `${target}/`);
  };
  // The innermost mount holding the folder is the one its files are on.
  const holding = (self.Mounts ?? []).filter(inside).sort((a, b) => trimmed(b.Destination).length - trimmed(a.Destination).length)[0];
  return holding?.Type === "bind" && trimmed(holding.Source) === trimmed(holding.Destination);
}

/** Gives a staged workspace, every folder and file in it, to the agent's user (symlinks themselves, not their targets). */
async function giveTo(dir: string, owner: { uid: number; gid: number }): Promise<void> {
  await lchown(dir, owner.uid, owner.gid);
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) await giveTo(path, owner);
    else await lchown(path, owner.uid, owner.gid);
  }
}

/** The engine's answer to a container of an image it does not have. */
function isMissingImage(err: unknown): boolean {
  return statusOf(err) === 404 && /no such image/i.test(firstLine(err));
}

/** The engine's answer to a bind mount of a folder it does not have. */
function isMissingBindSource(err: unknown): boolean {
  return statusOf(err) === 400 && /bind source path does not exist/i.test(firstLine(err));
}

/**
 * Makes sure `image` is on the engine, pulling it (with `auth`, for this pull only) if not.
 * Returns the PATH the image sets for its processes.
 */
async function ensureImage(docker: Docker, image: string, auth: Docker.AuthConfig | undefined, signal?: AbortSignal): Promise<string> {
  const pathOf = (info: Docker.ImageInspectInfo) =>
    info.Config.Env?.find((e) => e.startsWith("PATH="))?.slice(5) ?? "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  try {
    return pathOf(await docker.getImage(image).inspect());
  } catch (err) {
    if (statusOf(err) !== 404) throw err;
  }
  try {
    const progress = await docker.pull(image, auth ? { authconfig: auth, abortSignal: signal } : { abortSignal: signal });
    await new Promise<void>((resolve, reject) => docker.modem.followProgress(progress, (err) => (err ? reject(err) : resolve())));
    return pathOf(await docker.getImage(image).inspect());
  } catch (cause) {
    throw new BoxcarError(
      ErrorCode.imageUnavailable,
      `image ${image} is not on this Docker engine and could not be pulled: ${firstLine(cause)}`,
      { cause },
    );
  }
}

/**
 * Whose a container is: a cold one's labels say it; a warm one's label says its worker, and the
 * name it was given when a job took it (`boxcar-<job>.<attempt>.<sandbox>`) says the job, while
 * one no job took yet has none.
 */
function ownerOf(info: Docker.ContainerInfo): SandboxOwner | undefined {
  const labels = info.Labels;
  const workerId = labels[ContainerLabel.worker];
  if (!workerId) return undefined;
  // A session's container is its worker's while that worker lives.
  if (labels[ContainerLabel.session]) return { workerId };
  if (labels[ContainerLabel.warm]) {
    const taken = info.Names.map((n) => /^\/?boxcar-([0-9a-z]+)\.(\d+)\./.exec(n)).find((m) => m);
    return taken ? { workerId, jobId: taken[1] as string, attempt: Number(taken[2]) } : { workerId };
  }
  const jobId = labels[ContainerLabel.job];
  const attempt = Number(labels[ContainerLabel.attempt]);
  return jobId && Number.isInteger(attempt) ? { jobId, workerId, attempt } : undefined;
}

/** The name a warm container gets when a job takes it, so its job can be found after a crash. */
function takenName(spec: SandboxSpec, warm: WarmContainer): string {
  return `boxcar-${spec.jobId}.${spec.attempt}.${warm.sandboxId}`;
}

/** How long a run goes before its resource use is sampled. */
const USAGE_AFTER_MS = 1_000;

/** Samples the container's use of CPU, memory and processes while it runs. */
class UsageMeter {
  private cpuNs = 0;
  private memoryPeak = 0;
  private pidsPeak = 0;
  private samples = 0;

  async follow(container: Docker.Container): Promise<void> {
    try {
      const stream = (await container.stats({ stream: true })) as unknown as NodeJS.ReadableStream;
      let buffered = "";
      for await (const chunk of stream) {
        buffered += chunk.toString();
        let newline = buffered.indexOf("\n");
        while (newline >= 0) {
          this.sample(buffered.slice(0, newline));
          buffered = buffered.slice(newline + 1);
          newline = buffered.indexOf("\n");
        }
      }
    } catch {
      // the container ended: nothing more to sample
    }
  }

  private sample(line: string): void {
    if (!line.trim()) return;
    this.samples += 1;
    const stats = JSON.parse(line) as {
      cpu_stats?: { cpu_usage?: { total_usage?: number } };
      memory_stats?: { max_usage?: number; usage?: number };
      pids_stats?: { current?: number };
    };
    this.cpuNs = Math.max(this.cpuNs, stats.cpu_stats?.cpu_usage?.total_usage ?? 0);
    this.memoryPeak = Math.max(this.memoryPeak, stats.memory_stats?.max_usage ?? stats.memory_stats?.usage ?? 0);
    this.pidsPeak = Math.max(this.pidsPeak, stats.pids_stats?.current ?? 0);
  }

  /** Nothing when the run ended before the engine's first sample (about a second). */
  result(): ResourceUsage | undefined {
    if (this.samples === 0) return undefined;
    return { cpuMs: Math.round(this.cpuNs / 1e6), memoryPeakBytes: this.memoryPeak, pidsPeak: this.pidsPeak };
  }
}

function statusOf(err: unknown): number | undefined {
  return (err as { statusCode?: number } | undefined)?.statusCode;
}

/** Removing or killing what is already gone is fine. */
function ignoreGone(err: unknown): void {
  const status = statusOf(err);
  if (status !== 404 && status !== 409) throw err;
}

function firstLine(err: unknown): string {
  const message = (err as { json?: { message?: string } }).json?.message ?? (err as Error).message ?? String(err);
  return message.split("\n")[0] ?? message;
}
