import type { Topology } from "@boxcar/fabric";
import { getJson } from "@boxcar/fabric/internal";
import { JobRecord, WorkerInfo } from "@boxcar/protocol";
import { isLive } from "@boxcar/protocol/internal";
import type { SandboxOwner } from "./sandbox.js";

/**
 * Decides whether a sandbox found on this machine belongs to nobody any more: this worker does
 * not run its job, or its worker is gone (for a warm sandbox no job took, only that) (no presence, or a presence older than a few
 * heartbeats), or its job is no longer running that attempt on that worker. When unsure (the
 * lookups fail), it keeps the sandbox.
 */
export function orphanCheck(
  topology: Topology,
  selfId: string,
  runsHere: (jobId: string) => boolean,
  now: () => number = Date.now,
): (owner: SandboxOwner) => Promise<boolean> {
  return async (owner) => {
    // A warm sandbox no job took is its worker's for as long as that worker lives.
    if (owner.workerId === selfId) return owner.jobId !== undefined && !runsHere(owner.jobId);
    try {
      const presence = await getJson(topology.workers, owner.workerId, WorkerInfo, "worker");
      if (!presence || !isLive(presence.value, now())) return true;
      if (owner.jobId === undefined) return false;
      const job = await getJson(topology.jobs, owner.jobId, JobRecord, "job record");
      if (!job) return true;
      const { state, workerId, attempt } = job.value;
      return state !== "running" || workerId !== owner.workerId || attempt !== owner.attempt;
    } catch {
      return false;
    }
  };
}
