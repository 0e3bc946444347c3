/**
 * The Docker backend's provider (`createDockerSandboxProvider`): its options, the images it has
 * looked up, how workspaces reach containers on this engine, the warm pool, a job's container
 * (docker-job-sandbox.ts) or a session's (docker-session.ts) made for a spec, and removing this
 * worker's containers that are no longer anyone's (the reaper, a job's earlier attempts).
 */

import { randomBytes } from "node:crypto";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import Docker from "dockerode";
import { type LocalWorkspace, WorkspaceRoot } from "../../workspace/local-workspace.js";
import { defaultWorkRoot } from "../../workspace/work-root.js";
import { type SandboxOwner, type SandboxProvider, type SandboxSpec, sandboxOfSession } from "../sandbox.js";
import { CONTAINER_WORKSPACE, ContainerLabel, containerLabels, hardenedHostConfig, ownerOf, takenName } from "./container-config.js";
import { DockerSandbox } from "./docker-job-sandbox.js";
import { DockerSession } from "./docker-session.js";
import { checkNetwork, ensureImage, ignoreGone, isMissingImage, networksOf, selfContainer, statusOf } from "./engine.js";
import { WarmContainer, type WarmKey, type WarmMaker, WarmPool } from "./warm-pool.js";
import { bindable, giveTo, sharesFolder, type WorkspaceMounting } from "./workspace-mounting.js";

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

  /** A container that runs commands one after another through a helper: a session's, or a job's that runs many (labelled so). */
  const startSession = async (
    spec: SandboxSpec,
    seed: ((workspace: LocalWorkspace) => Promise<void>) | undefined,
    labels: Record<string, string>,
  ) => {
    const container = await settingsFor(spec.runtime);
    if (container.mounting !== "bind") {
      throw new BoxcarError(
        ErrorCode.noSandbox,
        "Docker sessions need the workspace bind-mounted, and this worker copies workspaces into containers (docs/docker.md#how-the-workspace-reaches-the-container)",
      );
    }
    if (spec.template) {
      // An admin's image, built or pulled on the engine: never pulled for a session.
      const present = await docker
        .getImage(container.image)
        .inspect()
        .then(
          () => true,
          (err: unknown) => {
            if (statusOf(err) === 404) return false;
            throw err;
          },
        );
      if (!present) {
        throw new BoxcarError(
          ErrorCode.noSandbox,
          `image ${container.image} of template ${spec.template.name} is not on this worker's engine; an admin builds or pulls it`,
        );
      }
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
            Labels: containerLabels(opts, spec.workerId, spec.id, labels),
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
      // Many commands (a prompt agent's tool calls): a container that runs each in turn, as a session's does.
      if (spec.commands === "many") {
        const session = await startSession(spec, undefined, {
          [ContainerLabel.job]: spec.jobId,
          [ContainerLabel.attempt]: String(spec.attempt),
        });
        return sandboxOfSession(session);
      }
      const containerSettings = await settingsFor(spec.runtime, signal);
      const { image, network } = containerSettings;
      const warm = spec.runtime.warm && containerSettings.mounting === "bind" ? await takeWarm(spec, { image, network }) : undefined;
      if (warm) return new DockerSandbox(docker, spec, { ...containerSettings, agentPath: warm.agentPath }, warm.files, warm);
      const agentPath = await imagePath(image, signal);
      signal?.throwIfAborted();
      const files = await settings.root.create({ workerId: spec.workerId, sandboxId: spec.id });
      return new DockerSandbox(docker, spec, { ...containerSettings, agentPath }, files);
    },

    createSession: (spec, seed) => startSession(spec, seed, { [ContainerLabel.session]: spec.jobId }),

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
