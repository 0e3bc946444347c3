import { jsonOf, type Logger } from "@boxcar/client";
import { followKv, type Topology } from "@boxcar/fabric";
import { type AgentDefinition, BoxcarError, ErrorCode, isLive, WorkerInfo, whyCannotServe } from "@boxcar/protocol";

/**
 * What the dispatcher knows of the workers, kept current by one watcher on the workers bucket
 * (not a read per submission).
 */
export class WorkerDirectory {
  private readonly workers = new Map<string, WorkerInfo>();
  private stopWatch: (() => void) | undefined;

  static async open(topology: Topology, log: Logger): Promise<WorkerDirectory> {
    const directory = new WorkerDirectory();
    directory.stopWatch = await followKv(topology.workers, (entry) => {
      if (entry.operation !== "PUT") {
        directory.workers.delete(entry.key);
        return;
      }
      const parsed = WorkerInfo.safeParse(jsonOf(entry));
      if (parsed.success) directory.workers.set(entry.key, parsed.data);
      else log.warn({ worker: entry.key }, "ignoring a worker presence that does not match the schema");
    });
    return directory;
  }

  /**
   * Refuses a job that no live worker of its pool can run (the submitter is told now, with what
   * to change, rather than left waiting). With no live worker in the pool at all the job is
   * accepted: workers may come later.
   */
  checkServable(agent: AgentDefinition, pool: string): void {
    const live = [...this.workers.values()].filter((w) => w.state === "running" && w.pools.includes(pool) && isLive(w));
    if (live.length === 0) return;
    const reasons = live.map((w) => ({ id: w.id, why: whyCannotServe(w, agent) }));
    if (reasons.some((r) => r.why === undefined)) return;
    const first = reasons[0];
    throw new BoxcarError(
      ErrorCode.noSandbox,
      `no live worker in pool ${pool} can run agent ${agent.name}${reasons.length > 1 ? ` (${reasons.length} workers)` : ""}: ${first?.id}: ${first?.why}`,
      { issues: [{ path: "agent", message: "no live worker can run it" }] },
    );
  }

  close(): void {
    this.stopWatch?.();
  }
}
