import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { nowIso, publishEvent } from "@boxcar/fabric/internal";
import {
  type ErrorInfo,
  type GatewayReach,
  PROTOCOL_VERSION,
  WORK_ITEM_VERSION,
  type WorkerEventType,
  type WorkerInfo,
} from "@boxcar/protocol";
import type { SandboxBackend } from "./sandbox/sandbox.js";
import type { ResolvedWorkerOptions } from "./worker-options.js";

/** What a worker's presence reports of it, read at each write. */
export interface WorkerPresenceContext {
  options: ResolvedWorkerOptions;
  /** The slots in use: jobs of its pools, and sessions. */
  load(): number;
  /** The ids of the jobs it runs. */
  jobs(): string[];
  /** Whether it drains (else it runs). */
  draining(): boolean;
  /** Backends whose provider is available, as last probed. */
  sandboxes(): ReadonlySet<SandboxBackend>;
  /** Probes the backends again. */
  probe(): Promise<void>;
  /** Sandboxes standing ready in the providers' warm pools. */
  warm(): number;
  /** Whether it takes jobs to run in its sessions. */
  sessionJobs: boolean;
  /** What its model gateway offers (no providers when it runs none). */
  models(): GatewayReach;
  /** Runs one step of the worker's lifecycle; a failure is logged and never thrown. */
  step(what: string, action: () => Promise<unknown>): Promise<void>;
}

/** What the presence last wrote: when, what it promised (its `heartbeatMs`), and what it said. */
interface Written {
  atMs: number;
  promisedMs: number;
  said: string;
}

/**
 * A worker's presence (docs/architecture.md, worker presence): its `WorkerInfo` entry in the
 * workers bucket and its worker events (`started`, `heartbeat`, `draining`, `work_rejected`,
 * `stopped`), refreshed by a heartbeat every `heartbeatMs`, and removed when it stops.
 *
 * An idle worker (no job, no session, not draining) whose presence says the same as last time
 * writes it only every `idleHeartbeatMs`, and its entry says so (`heartbeatMs`), so readers give
 * it that much longer before they count it gone: a thousand idle workers' writes, each replicated
 * to three servers, were most of what an idle fleet cost the servers (docs/benchmarks.md#idle-workers).
 * A change (a job taken, a sandbox backend lost) is written at the next tick, at most
 * `heartbeatMs` later.
 */
export class WorkerPresence {
  private readonly startedAt = nowIso();
  private written: Written | undefined;
  private heartbeat: NodeJS.Timeout | undefined;
  /** The heartbeat in progress, if any: `remove()` waits for it before removing the presence. */
  private beating: Promise<void> | undefined;
  /** A capability probe in progress, shared by heartbeats while it lasts. */
  private probing: Promise<void> | undefined;
  /** Set once the presence is removed: nothing may write it again. */
  private closed = false;

  constructor(private readonly ctx: WorkerPresenceContext) {}

  /** Beats every `heartbeatMs` from now on. */
  startHeartbeat(): void {
    this.heartbeat = setInterval(() => {
      // One heartbeat at a time: while a write hangs (NATS cut off), ticks do not pile up more.
      this.beating ??= this.beat().finally(() => {
        this.beating = undefined;
      });
    }, this.ctx.options.heartbeatMs);
  }

  stopHeartbeat(): void {
    clearInterval(this.heartbeat);
  }

  /**
   * Removes the presence for good. A heartbeat still in flight must land before the delete, or
   * it would bring back a presence that readers then see as gone.
   */
  async remove(): Promise<void> {
    await this.beating;
    this.closed = true;
    await this.ctx.options.topology.workers.delete(this.ctx.options.workerId);
  }

  /** Writes the worker's `WorkerInfo` as it is now (nothing once the presence is removed). */
  async put(): Promise<void> {
    if (this.closed) return;
    const { options } = this.ctx;
    const info = this.info();
    await options.topology.workers.put(options.workerId, JSON.stringify(info));
    this.written = { atMs: Date.parse(info.heartbeatAt), promisedMs: info.heartbeatMs, said: said(info) };
  }

  /** The worker's `WorkerInfo` as it is now, promising its next write within an idle or a busy worker's interval. */
  private info(): WorkerInfo {
    const { options } = this.ctx;
    return {
      v: PROTOCOL_VERSION,
      id: options.workerId,
      host: hostname(),
      pid: process.pid,
      pools: options.pools,
      sandboxes: [...this.ctx.sandboxes()],
      policy: options.policy,
      capacity: options.concurrency,
      load: this.ctx.load(),
      jobs: this.ctx.jobs(),
      state: this.ctx.draining() ? "draining" : "running",
      startedAt: this.startedAt,
      heartbeatAt: nowIso(),
      heartbeatMs: this.idle() ? options.idleHeartbeatMs : options.heartbeatMs,
      workItems: [1, WORK_ITEM_VERSION],
      warm: this.ctx.warm(),
      sessionJobs: this.ctx.sessionJobs,
      models: this.ctx.models(),
    };
  }

  /** No job, no session, not draining: its presence may be written less often. */
  private idle(): boolean {
    return this.ctx.load() === 0 && !this.ctx.draining();
  }

  /**
   * Whether this tick may leave the presence as it is: the worker is idle, the entry says what it
   * would say now and promised an idle worker's interval, and the next tick still comes within it.
   */
  private mayWait(): boolean {
    const last = this.written;
    if (!last || !this.idle() || last.promisedMs !== this.ctx.options.idleHeartbeatMs) return false;
    if (Date.now() + this.ctx.options.heartbeatMs > last.atMs + last.promisedMs) return false;
    return said(this.info()) === last.said;
  }

  /** Publishes a worker event. */
  async announce(type: WorkerEventType, error?: ErrorInfo): Promise<void> {
    const { options } = this.ctx;
    await publishEvent(options.topology, {
      v: PROTOCOL_VERSION,
      at: nowIso(),
      kind: "worker",
      type,
      workerId: options.workerId,
      load: this.ctx.load(),
      capacity: options.concurrency,
      ...(error ? { error } : {}),
    });
  }

  /**
   * Refreshes the presence (and so the heartbeat readers judge the worker by) and publishes a
   * `heartbeat` event. A capability probe that does not answer (say, a Docker engine that
   * hangs) must not hold the heartbeat back, or a busy worker would look gone: the presence
   * waits for it at most half a heartbeat and otherwise carries what was known.
   */
  private async beat(): Promise<void> {
    this.probing ??= this.ctx.probe().finally(() => {
      this.probing = undefined;
    });
    const probeWait = new AbortController();
    await Promise.race([this.probing, sleep(this.ctx.options.heartbeatMs / 2, undefined, { signal: probeWait.signal }).catch(() => {})]);
    probeWait.abort();
    if (this.mayWait()) return;
    await this.ctx.step("heartbeat", async () => {
      await this.put();
      await this.announce("heartbeat");
    });
  }
}

/** What a presence says of its worker, but when it was written and when it promises the next write. */
function said(info: WorkerInfo): string {
  const { heartbeatAt: _at, heartbeatMs: _promised, ...rest } = info;
  return JSON.stringify(rest);
}
