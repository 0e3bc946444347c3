import { deferred, type Logger } from "@boxcar/common";
import { patiently } from "@boxcar/fabric";
import type { Subscription } from "@nats-io/transport-node";
import { ModelGateway } from "./gateway/gateway.js";
import { RoomWaits } from "./intake/room-waits.js";
import { Slots } from "./intake/slots.js";
import { listenForCancels, listenForSignals, refusedBy } from "./job-controls.js";
import { JobRuns } from "./job-runs.js";
import type { SandboxBackend, SandboxProvider } from "./sandbox/sandbox.js";
import { orphanCheck } from "./sandbox/sandbox-reaper.js";
import { SessionHost } from "./sessions/session-host.js";
import { WorkerMetrics } from "./worker-metrics.js";
import { type ResolvedWorkerOptions, resolveWorkerOptions, type WorkerOptions } from "./worker-options.js";
import { WorkerPresence } from "./worker-presence.js";
import { type PullingContext, pullPool, pullSessionJobs } from "./worker-pulling.js";
import { WorkspaceRoot } from "./workspace/local-workspace.js";

/** `idle` until `run()`, `draining` after `drain()` or `close()`, `stopped` at the end. */
export type WorkerLifecycleState = "idle" | "running" | "draining" | "stopped";

/** Pulls jobs from its pools and runs them in sandboxes. */
export interface Worker extends AsyncDisposable {
  readonly id: string;
  readonly state: WorkerLifecycleState;
  /** True from when it starts pulling work until it drains: what its readiness probe reports. */
  readonly accepting: boolean;
  /** Starts pulling work; resolves once the worker has stopped. */
  run(): Promise<void>;
  /**
   * Stops taking work and lets running jobs finish for up to `graceMs` (default: the
   * `drainGraceMs` option); then stops the rest and hands them back to the queue. Resolves
   * once the worker has stopped.
   */
  drain(graceMs?: number): Promise<void>;
  /** Stops at once, handing running jobs back. Safe to call twice, also during a drain. */
  close(): Promise<void>;
}

export function createWorker(options: WorkerOptions): Worker {
  return new BoxcarWorker(resolveWorkerOptions(options));
}

/**
 * The worker's lifecycle: it starts its parts (the pools' consumers, the cancels and signals it
 * listens for, the model gateway, the sessions, its presence and heartbeat, the reaper, the pull
 * loops) and stops them in the reverse order once it drains. The parts: the jobs it runs
 * (`JobRuns`, job-runs.ts), the pull loops (worker-pulling.ts), its presence (worker-presence.ts),
 * the cancels and signals (job-controls.ts).
 */
class BoxcarWorker implements Worker {
  readonly id: string;
  state: WorkerLifecycleState = "idle";
  accepting = false;
  private readonly log: Logger;
  private readonly providers: ReadonlyMap<SandboxBackend, SandboxProvider>;
  private readonly metrics: WorkerMetrics | undefined;
  private readonly slots: Slots;
  /** Its attempts that wait for room in JetStream's store: it takes no new job while any does. */
  private readonly roomWaits = new RoomWaits();
  /** The jobs it runs. */
  private readonly runs: JobRuns;
  private readonly presence: WorkerPresence;
  /** Whether any of its backends holds sessions: it then takes jobs to run in them. */
  private readonly holdsSessions: boolean;
  /** Aborted when pulling stops. */
  private readonly pulling = new AbortController();
  /** Aborted by close(): a drain's grace ends at once. */
  private readonly graceOver = new AbortController();
  private capabilities: ReadonlySet<SandboxBackend> = new Set();
  /** The shortest ack wait of this worker's pool consumers. */
  private leaseMs = Number.POSITIVE_INFINITY;
  private starting: Promise<void> | undefined;
  private stopping: Promise<void> | undefined;
  private readonly stopped = deferred();
  private startError: unknown;
  private loops: Promise<void>[] = [];
  private reaper: NodeJS.Timeout | undefined;
  private cancelSub: Subscription | undefined;
  private stopSignals: (() => void) | undefined;
  private sessions: SessionHost | undefined;
  /** The model gateway its agents call their providers through, when it holds any key. */
  private gateway: ModelGateway | undefined;

  constructor(private readonly options: ResolvedWorkerOptions) {
    this.id = options.workerId;
    this.log = options.logger.child({ workerId: options.workerId });
    this.providers = new Map(options.providers.map((p) => [p.kind, p]));
    this.slots = new Slots(options.concurrency);
    this.holdsSessions = options.providers.some((provider) => provider.createSession !== undefined);
    this.runs = new JobRuns({
      options,
      log: this.log,
      slots: this.slots,
      pulling: this.pulling.signal,
      runContext: () => ({
        options: this.options,
        log: this.log,
        capabilities: () => this.capabilities,
        providers: this.providers,
        leaseMs: this.leaseMs,
        metrics: this.metrics,
        sessions: this.sessions,
        gateway: this.gateway,
        roomWaits: this.roomWaits,
      }),
      rejected: (error) => void this.step("announce a rejected work item", () => this.presence.announce("work_rejected", error)),
    });
    this.presence = new WorkerPresence({
      options,
      load: () => this.load,
      jobs: () => this.runs.ids(),
      draining: () => this.state === "draining",
      sandboxes: () => this.capabilities,
      models: () => this.gateway?.reach() ?? { providers: [], public: false },
      probe: () => this.refreshCapabilities(),
      warm: () => this.warmReady(),
      sessionJobs: this.holdsSessions,
      step: (what, action) => this.step(what, action),
    });
    this.metrics = options.metrics
      ? new WorkerMetrics(options.metrics, () => ({ running: this.runs.size, capacity: options.concurrency, warm: this.warmReady() }))
      : undefined;
  }
  run(): Promise<void> {
    if (this.state === "idle") {
      this.state = "running";
      this.starting = this.start().catch((err: unknown) => {
        // Told to stop while it waited for JetStream at start: a stop, not a failure.
        if (this.pulling.signal.aborted) {
          this.log.info({}, "worker stopped before it started");
          return;
        }
        this.log.error({ err }, "worker failed to start");
        this.startError = err;
        void this.close();
      });
    }
    return this.stopped.promise;
  }

  drain(graceMs = this.options.drainGraceMs): Promise<void> {
    this.stopping ??= this.stop(graceMs);
    return this.stopping;
  }

  close(): Promise<void> {
    this.graceOver.abort();
    return this.drain(0);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  private async start(): Promise<void> {
    const { topology } = this.options;
    await this.refreshCapabilities();
    // Keep-alives must come well inside the shortest lease of the pools this worker pulls.
    // Started while the cluster recovers, a worker waits for JetStream instead of giving up.
    const wait = <T>(what: string, step: () => Promise<T>) => patiently(what, step, this.log, this.pulling.signal);
    for (const pool of this.options.pools) {
      this.leaseMs = Math.min(this.leaseMs, await wait(`the ${pool} pool's consumers`, () => topology.ensurePoolConsumer(pool)));
    }
    // A subscription the server refuses (credentials from before it: push the account) calls its
    // callback with an error and no message: logged, never read.
    const refused = refusedBy(this.log);
    this.cancelSub = listenForCancels(topology, refused("cancels"), (jobId) => this.runs.get(jobId)?.stop("cancelled"));
    // A signal is answered by the worker running its job; the others let it pass.
    this.stopSignals = listenForSignals(topology, refused("signals"), (jobId, msg) => {
      const run = this.runs.get(jobId);
      if (run) void run.signal(msg);
      return run !== undefined;
    });
    if (this.options.modelGateway) {
      this.gateway = await ModelGateway.start(this.options.modelGateway, this.log);
      this.log.info({ url: this.gateway.url, providers: this.gateway.providers }, "model gateway listening");
    }
    this.sessions = new SessionHost({
      topology,
      workerId: this.id,
      options: this.options,
      providers: this.providers,
      capabilities: () => this.capabilities,
      slots: this.slots,
      log: this.log,
    });
    this.sessions.start();
    // Jobs to run in this worker's sessions come on a consumer of its own.
    if (this.holdsSessions) {
      this.leaseMs = Math.min(this.leaseMs, await wait("its sessions' consumer", () => topology.ensureWorkerConsumer(this.id)));
    }
    await topology.nc.flush();
    // On a full store the worker waits for room instead of exiting: once space frees, it drains the queue.
    await patiently("the presence entry", () => this.presence.put(), this.log, this.pulling.signal, { untilRoom: true });
    await this.presence.announce("started");
    this.presence.startHeartbeat();
    await this.reap();
    this.reaper = setInterval(() => void this.reap(), this.options.reapIntervalMs);
    for (const provider of this.options.providers) {
      provider.prepare?.(this.id, (err) => this.log.warn({ err, sandbox: provider.kind }, "could not make a warm sandbox"));
    }
    const share = Math.max(1, Math.ceil(this.options.concurrency / this.options.pools.length));
    const pulling: PullingContext = {
      topology,
      workerId: this.id,
      log: this.log,
      slots: this.slots,
      roomWaits: this.roomWaits,
      signal: this.pulling.signal,
      take: (delivery, slotted) => this.runs.dispatch(delivery, slotted),
    };
    this.loops = this.options.pools.map((pool) => pullPool(pulling, pool, share));
    if (this.holdsSessions) this.loops.push(pullSessionJobs(pulling));
    this.accepting = !this.pulling.signal.aborted;
    this.log.info(
      {
        pools: this.options.pools,
        concurrency: this.options.concurrency,
        sandboxes: [...this.capabilities],
        workRoot: this.options.workRoot,
      },
      "worker started",
    );
  }

  private async stop(graceMs: number): Promise<void> {
    if (this.state === "idle") {
      this.state = "stopped";
      this.stopped.resolve();
      return;
    }
    // Not ready from now on, also if a start still under way finishes in the meantime; a start
    // still waiting for JetStream gives up.
    this.accepting = false;
    this.pulling.abort();
    await this.starting;
    this.accepting = false;
    this.state = "draining";
    this.log.info({ running: this.runs.size, graceMs }, "worker draining");
    this.slots.close();
    await this.step("announce draining", async () => {
      await this.presence.put();
      await this.presence.announce("draining");
    });

    const finished = this.runs.finished();
    // A plain timer, not AbortSignal.timeout: on Node 20 that signal can be garbage-collected
    // inside AbortSignal.any and never fire (nodejs/node#57736).
    let graceTimer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<void>((resolve) => {
      graceTimer = setTimeout(resolve, graceMs);
      this.graceOver.signal.addEventListener("abort", () => resolve(), { once: true });
    });
    await Promise.race([finished, graceOver]);
    clearTimeout(graceTimer);
    this.runs.stopAll("worker_stopped");
    await finished;
    await Promise.allSettled(this.loops);

    this.presence.stopHeartbeat();
    clearInterval(this.reaper);
    for (const provider of this.options.providers) {
      if (provider.close) await this.step(`remove warm ${provider.kind} sandboxes`, () => provider.close?.() ?? Promise.resolve());
    }
    await this.step("stop listening for cancels", async () => this.cancelSub?.unsubscribe());
    await this.step("stop listening for signals", async () => this.stopSignals?.());
    await this.step("close the sessions", async () => this.sessions?.stop());
    await this.step("close the model gateway", async () => this.gateway?.close());
    // The presence goes once a heartbeat still in flight has landed (`WorkerPresence.remove`).
    await this.step("remove presence", () => this.presence.remove());
    await this.step("announce stopped", () => this.presence.announce("stopped"));
    this.state = "stopped";
    this.log.info({}, "worker stopped");
    if (this.startError === undefined) this.stopped.resolve();
    else this.stopped.reject(this.startError);
  }

  /** Removes sandboxes that crashed workers (or abandoned runs) left behind. */
  private async reap(): Promise<void> {
    const isOrphan = orphanCheck(this.options.topology, this.id, (jobId) => this.runs.has(jobId));
    for (const provider of this.options.providers) {
      if (!provider.reap || !this.capabilities.has(provider.kind)) continue;
      await this.step(`reap ${provider.kind} sandboxes`, async () => {
        const removed = await provider.reap?.(isOrphan);
        if (removed) this.log.info({ backend: provider.kind, removed }, "removed sandboxes left by gone workers");
      });
    }
    // Their workspaces too: a killed worker leaves its folders under the work root (in memory,
    // on /dev/shm), which nothing else would ever remove.
    await this.step("sweep workspaces of gone workers", async () => {
      const root = new WorkspaceRoot(this.options.workRoot, this.options.topology.systemId);
      const removed = await root.sweep((workerId) => isOrphan({ workerId }));
      if (removed) this.log.info({ removed }, "removed workspaces left by gone workers");
    });
  }

  private async refreshCapabilities(): Promise<void> {
    const kinds = await Promise.all(
      this.options.providers.map(async (p) => ((await p.available().catch(() => false)) ? p.kind : undefined)),
    );
    this.capabilities = new Set(kinds.filter((k): k is SandboxBackend => k !== undefined));
  }

  /** Sandboxes standing ready in the providers' warm pools. */
  private warmReady(): number {
    return this.options.providers.reduce((n, p) => n + (p.warmReady?.() ?? 0), 0);
  }

  /** The slots in use: jobs of its pools, and sessions (a job in a session uses its session's). */
  private get load(): number {
    return this.runs.slotted() + (this.sessions?.size ?? 0);
  }

  /** Runs one step of the lifecycle; a failure is logged and the next step still runs. */
  private async step(what: string, action: () => Promise<unknown>): Promise<void> {
    try {
      await action();
    } catch (err) {
      this.log.warn({ err }, `worker could not ${what}`);
    }
  }
}
