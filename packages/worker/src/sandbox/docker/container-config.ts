/**
 * What every container Boxcar creates carries: the workspace's path inside it, the labels that
 * say whose it is (this system's, its worker's, its job's or session's), the hardened host
 * configuration it runs under, and, read back from a container's labels and name, whose it is
 * (`ownerOf`; a warm one says its job in the name it gets when taken, `takenName`). The Docker
 * provider (docker-sandbox.ts) makes and reaps containers by these, as a job's container
 * (docker-job-sandbox.ts) is made by them.
 */

import type Docker from "dockerode";
import type { SandboxOwner, SandboxSpec } from "../sandbox.js";
import type { WarmContainer } from "./warm-pool.js";

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

/** The labels every container of this system carries (its prefix, system, worker and sandbox), and `more`. */
export function containerLabels(
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

/**
 * Whose a container is: a cold one's labels say it; a warm one's label says its worker, and the
 * name it was given when a job took it (`boxcar-<job>.<attempt>.<sandbox>`) says the job, while
 * one no job took yet has none.
 */
export function ownerOf(info: Docker.ContainerInfo): SandboxOwner | undefined {
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
export function takenName(spec: SandboxSpec, warm: WarmContainer): string {
  return `boxcar-${spec.jobId}.${spec.attempt}.${warm.sandboxId}`;
}
