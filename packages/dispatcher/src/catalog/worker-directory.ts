import { jsonOf, type Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { followKv } from "@boxcar/fabric/internal";
import { type AgentDefinition, BoxcarError, ErrorCode, WorkerInfo, workerStatus } from "@boxcar/protocol";
import { isLive, whyCannotServe } from "@boxcar/protocol/internal";
import { Sweep } from "../loops/sweep.js";

/** How often workers that stopped heartbeating are forgotten, unless told otherwise. */
const FORGET_EVERY_MS = 60_000;

/**
 * What the dispatcher knows of the workers, kept current by one watcher on the workers bucket
 * (not a read per submission). A worker whose presence has gone stale is forgotten within a
 * minute: nats-server 2.10 sends no delete when a KV entry expires, and autoscaled workers come
 * and go. One that heartbeats again is known again from its next presence.
 */
export class WorkerDirectory {
  private readonly workers = new Map<string, WorkerInfo>();
  private stopWatch: (() => void) | undefined;
  /** Forgets the workers gone (it keeps no process alive). */
  private readonly forgetting: Sweep;

  /** Forgets the workers gone every `forgetEveryMs` once started. */
  constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
    forgetEveryMs = FORGET_EVERY_MS,
  ) {
    this.forgetting = new Sweep({
      pass: async () => this.forgetGone(),
      intervalMs: forgetEveryMs,
      onError: (err) => log.warn({ err }, "could not forget the workers gone"),
      unref: true,
    });
  }

  /** A directory, started. */
  static async open(topology: Topology, log: Logger): Promise<WorkerDirectory> {
    const directory = new WorkerDirectory(topology, log);
    await directory.start();
    return directory;
  }

  /** Follows the workers bucket (every presence stored, then each change), and starts forgetting the workers gone. */
  async start(): Promise<void> {
    this.stopWatch = await followKv(this.topology.workers, (entry) => {
      if (entry.operation !== "PUT") {
        this.workers.delete(entry.key);
        return;
      }
      const parsed = WorkerInfo.safeParse(jsonOf(entry));
      if (parsed.success) this.workers.set(entry.key, parsed.data);
      else this.log.warn({ worker: entry.key }, "ignoring a worker presence that does not match the schema");
    });
    this.forgetting.start();
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

  /**
   * The worker to hold a new session of `agent` in `pool`: the least loaded live, running one
   * that can run the agent and has a free slot. Refuses when there is none, saying why.
   */
  pickForSession(agent: AgentDefinition, pool: string): WorkerInfo {
    const live = [...this.workers.values()].filter((w) => w.state === "running" && w.pools.includes(pool) && isLive(w));
    const able = live.filter((w) => whyCannotServe(w, agent) === undefined);
    const free = able.filter((w) => w.load < w.capacity).sort((a, b) => a.load / a.capacity - b.load / b.capacity);
    const chosen = free[0];
    if (chosen) return chosen;
    if (able.length > 0)
      throw new BoxcarError(ErrorCode.unavailable, `every worker in pool ${pool} that can run ${agent.name} is busy: try again later`);
    this.checkServable(agent, pool);
    throw new BoxcarError(ErrorCode.unavailable, `no live worker in pool ${pool} to hold a session: start one, or name the pool`);
  }

  /** Whether the worker takes jobs to run in its sessions (a worker of an earlier release does not). */
  takesSessionJobs(workerId: string): boolean {
    return this.workers.get(workerId)?.sessionJobs === true;
  }

  /** A worker's status as its presence says, or undefined when this directory no longer holds it (gone long ago). */
  statusOf(workerId: string): ReturnType<typeof workerStatus> | undefined {
    const info = this.workers.get(workerId);
    return info ? workerStatus(info) : undefined;
  }

  /**
   * Whether every live worker reads work items of `version` (a rolling upgrade is over, as far
   * as this directory can tell). True with no live worker: an item a worker of an earlier
   * release cannot read goes back to the queue (see docs/deploy.md#upgrades), it is not lost.
   */
  allRead(version: number): boolean {
    // Called for every work item: the version is checked first, so a fleet that reads it costs
    // no clock reads.
    for (const w of this.workers.values()) if (!(w.workItems ?? [1]).includes(version) && isLive(w)) return false;
    return true;
  }

  /** How many workers it holds: those heartbeating, and those gone less than a minute or so. */
  get size(): number {
    return this.workers.size;
  }

  /** Forgets the workers whose presence is older than a few of their heartbeats. */
  forgetGone(now: number = Date.now()): void {
    for (const [id, info] of this.workers) if (workerStatus(info, now) === "gone") this.workers.delete(id);
  }

  /** Stops following and forgetting. */
  async close(): Promise<void> {
    this.stopWatch?.();
    await this.forgetting.stop();
  }
}
