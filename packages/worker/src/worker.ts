import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "@boxcar/common";
import { nowIso, patiently, publishEvent, type Topology } from "@boxcar/fabric";
import {
  BoxcarError,
  decodeMessage,
  ErrorCode,
  type ErrorInfo,
  PROTOCOL_VERSION,
  toErrorInfo,
  WORK_ITEM_VERSION,
  type WorkerEventType,
  type WorkerInfo,
  WorkItem,
} from "@boxcar/protocol";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { ModelGateway } from "./gateway/gateway.js";
import { PoolPuller } from "./intake/pool-puller.js";
import { Slots } from "./intake/slots.js";
import type { WorkDelivery } from "./intake/work-delivery.js";
import { JobRun } from "./run/job-run.js";
import type { SandboxBackend, SandboxProvider } from "./sandbox/sandbox.js";
import { orphanCheck } from "./sandbox/sandbox-reaper.js";
import { SessionHost } from "./sessions/session-host.js";
import { WorkerMetrics } from "./worker-metrics.js";
import { type ResolvedWorkerOptions, resolveWorkerOptions, type WorkerOptions } from "./worker-options.js";
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

/** How long a work item from a newer release waits before it is offered again. */
const NEWER_RELEASE_DELAY_MS = 5_000;

/**
 * Why a work item this release cannot read is a newer release's (see docs/deploy.md#upgrades),
 * not a malformed one: a later protocol version, or fields it does not know. Undefined when it
 * is neither.
 */
function newerRelease(data: Uint8Array): string | undefined {
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder().decode(data));
  } catch {
    return undefined;
  }
  const version = (json as { v?: unknown } | null)?.v;
  if (typeof version === "number" && version > WORK_ITEM_VERSION) {
    return `a work item of version ${version}; this worker reads versions up to ${WORK_ITEM_VERSION}`;
  }
  const parsed = WorkItem.safeParse(json);
  if (parsed.success || !parsed.error.issues.every((issue) => issue.code === "unrecognized_keys")) return undefined;
  return "a work item from a newer release (fields this worker does not know)";
}

/** Pause after a failed pull. */
const RETRY_MS = 1_000;
/** How many jobs of its sessions a worker asks for at once (each waits for its session's lock). */
const SESSION_JOBS_AT_ONCE = 16;

class BoxcarWorker implements Worker {
  readonly id: string;
  state: WorkerLifecycleState = "idle";
  accepting = false;
  private readonly log: Logger;
  private readonly providers: ReadonlyMap<SandboxBackend, SandboxProvider>;
  private readonly metrics: WorkerMetrics | undefined;
  private readonly slots: Slots;
  /** Jobs in hand, by id, with the promise that settles when each is handled. */
  /** The jobs it runs, by id; `slotted`: one of its slots (a job in a session holds none). */
  private readonly runs = new Map<string, { run: JobRun; done: Promise<void>; slotted: boolean }>();
  /** Whether any of its backends holds sessions: it then takes jobs to run in them. */
  private readonly holdsSessions: boolean;
  /** Aborted when pulling stops. */
  private readonly pulling = new AbortController();
  /** Aborted by close(): a drain's grace ends at once. */
  private readonly graceOver = new AbortController();
  private readonly startedAt = nowIso();
  private capabilities: ReadonlySet<SandboxBackend> = new Set();
  /** The shortest ack wait of this worker's pool consumers. */
  private leaseMs = Number.POSITIVE_INFINITY;
  private starting: Promise<void> | undefined;
  private stopping: Promise<void> | undefined;
  private readonly stopped = deferred();
  private startError: unknown;
  private loops: Promise<void>[] = [];
  private heartbeat: NodeJS.Timeout | undefined;
  /** The heartbeat in progress, if any: stop() waits for it before removing the presence. */
  private beating: Promise<void> | undefined;
  /** A capability probe in progress, shared by heartbeats while it lasts. */
  private probing: Promise<void> | undefined;
  /** Set once the presence is removed: nothing may write it again. */
  private presenceClosed = false;
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
    const cancelPrefix = topology.names.subjects.cancel("");
    // A subscription the server refuses (credentials from before it: push the account) calls its
    // callback with an error and no message: logged, never read.
    const refused = (what: string) => (err: Error | null) => {
      if (err) this.log.error({ err }, `cannot listen for ${what}: push the account again (boxcar auth push)`);
      return err !== null;
    };
    this.cancelSub = topology.nc.subscribe(topology.names.subjects.cancelAll, {
      callback: (err, msg) => {
        if (!refused("cancels")(err)) this.runs.get(msg.subject.slice(cancelPrefix.length))?.run.stop("cancelled");
      },
    });
    // A signal is answered by the worker running its job; the others let it pass.
    const signalPrefix = topology.names.subjects.signal("");
    this.stopSignals = listenForSignals(topology, refused("signals"), (msg) => {
      const run = this.runs.get(msg.subject.slice(signalPrefix.length))?.run;
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
    await patiently("the presence entry", () => this.putPresence(), this.log, this.pulling.signal, { untilRoom: true });
    await this.announce("started");
    this.heartbeat = setInterval(() => {
      // One heartbeat at a time: while a write hangs (NATS cut off), ticks do not pile up more.
      this.beating ??= this.beat().finally(() => {
        this.beating = undefined;
      });
    }, this.options.heartbeatMs);
    await this.reap();
    this.reaper = setInterval(() => void this.reap(), this.options.reapIntervalMs);
    for (const provider of this.options.providers) {
      provider.prepare?.(this.id, (err) => this.log.warn({ err, sandbox: provider.kind }, "could not make a warm sandbox"));
    }
    const share = Math.max(1, Math.ceil(this.options.concurrency / this.options.pools.length));
    this.loops = this.options.pools.map((pool) => this.pull(pool, share));
    if (this.holdsSessions) this.loops.push(this.pullSessionJobs());
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

  /**
   * Pulls a pool's work while the worker runs, higher priorities first (see `PoolPuller`). Each
   * sweep asks for at most `share` jobs and only for slots it has reserved, and an idle wait
   * starts a job only in a free slot, so the worker never holds more than `concurrency` jobs.
   */
  private async pull(pool: string, share: number): Promise<void> {
    const puller = PoolPuller.ofPool(this.options.topology, pool, { log: this.log.child({ pool }) });
    while (!this.pulling.signal.aborted) {
      try {
        if (!(await this.sweep(puller, share))) return;
      } catch (err) {
        // NATS trouble mid-sweep, a flush cut short by a reconnect, ...: pause and go on.
        if (this.pulling.signal.aborted) return;
        this.log.warn({ err, pool }, "pulling work failed; trying again");
        await sleep(RETRY_MS, undefined, { signal: this.pulling.signal }).catch(() => {});
      }
    }
  }

  /**
   * Takes the jobs submitted to run in this worker's sessions (docs/sessions.md#jobs-in-a-session)
   * while the worker runs. They hold no slot: each session holds one already, and its lock lets
   * one of its jobs run at a time.
   */
  private async pullSessionJobs(): Promise<void> {
    const puller = PoolPuller.ofSessions(this.options.topology, this.id, { log: this.log.child({ sessionJobs: true }) });
    const take = (delivery: WorkDelivery) => this.dispatch(delivery, false);
    // Removed by a dispatcher that took this worker for gone (its heartbeats stalled): made again.
    let ensuring = false;
    const ensureConsumer = () => {
      if (ensuring) return;
      ensuring = true;
      void this.options.topology
        .ensureWorkerConsumer(this.id)
        .catch(() => {})
        .finally(() => {
          ensuring = false;
        });
    };
    while (!this.pulling.signal.aborted) {
      try {
        await puller.take(SESSION_JOBS_AT_ONCE, take);
        await puller.waitForWork({
          signal: this.pulling.signal,
          offer: (delivery) => {
            take(delivery);
            return true;
          },
          onFull: () => () => {},
          onPullFailed: ensureConsumer,
        });
      } catch (err) {
        if (this.pulling.signal.aborted) return;
        this.log.warn({ err }, "pulling the jobs of this worker's sessions failed; trying again");
        ensureConsumer();
        await sleep(RETRY_MS, undefined, { signal: this.pulling.signal }).catch(() => {});
      }
    }
  }

  /** One sweep for the slots free now, then a wait for work if it left any free; false once the worker takes no more. */
  private async sweep(puller: PoolPuller, share: number): Promise<boolean> {
    const reserved = await this.slots.acquire(share);
    if (reserved === 0) return false;
    // Counted as they come: a sweep that fails half-way still hands its slots to the jobs it took.
    let taken = 0;
    try {
      await puller.take(reserved, (delivery) => {
        taken += 1;
        this.dispatch(delivery);
      });
    } finally {
      this.slots.release(reserved - taken);
    }
    if (taken < reserved) {
      await puller.waitForWork({
        signal: this.pulling.signal,
        offer: (delivery) => {
          if (!this.slots.tryAcquire()) return false;
          this.dispatch(delivery);
          return true;
        },
        onFull: (full) => this.slots.onFull(full),
      });
    }
    return true;
  }

  /** Starts one delivered work item; it holds one slot until it is handled (`slotted`: a pool's; a session's job holds none). */
  private dispatch(msg: WorkDelivery, slotted = true): void {
    const release = () => {
      if (slotted) this.slots.release(1);
    };
    if (this.pulling.signal.aborted) {
      msg.nak();
      release();
      return;
    }
    let item: WorkItem;
    try {
      const unsigned = this.options.verifier?.problem(msg.subject, msg.data, msg.headers);
      if (unsigned) throw new BoxcarError(ErrorCode.invalid, `${unsigned}; it was not run`);
      item = decodeMessage(WorkItem, msg.data, "work item");
    } catch (err) {
      const newer = newerRelease(msg.data);
      if (newer) {
        // Mid-upgrade, a newer dispatcher's item: hand it back for a newer worker. Its job stays
        // queued until one comes or its queue timeout.
        this.log.warn({ seq: msg.seq, err: (err as Error).message }, `${newer}; handing it back`);
        msg.nak(NEWER_RELEASE_DELAY_MS);
      } else {
        this.reject(msg, toErrorInfo(err));
      }
      release();
      return;
    }
    if (this.runs.has(item.jobId)) {
      // Redelivered while still running here: the run in progress acknowledges it.
      this.log.warn({ jobId: item.jobId }, "work item delivered again while its job runs here; ignoring the copy");
      release();
      return;
    }
    const run = new JobRun(
      {
        options: this.options,
        log: this.log,
        capabilities: () => this.capabilities,
        providers: this.providers,
        leaseMs: this.leaseMs,
        metrics: this.metrics,
        sessions: this.sessions,
        gateway: this.gateway,
      },
      msg,
      item,
    );
    const done = run.run().finally(() => {
      this.runs.delete(item.jobId);
      release();
    });
    this.runs.set(item.jobId, { run, done, slotted });
  }

  /** A work item that can never run: terminate it so it is not delivered again, and say why. */
  private reject(msg: WorkDelivery, error: ErrorInfo): void {
    msg.term(`${error.code}: ${error.message}`.slice(0, 1024));
    this.log.warn({ error, seq: msg.seq }, "rejected a work item");
    void this.step("announce a rejected work item", () => this.announce("work_rejected", error));
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
      await this.putPresence();
      await this.announce("draining");
    });

    const finished = Promise.all([...this.runs.values()].map((r) => r.done));
    // A plain timer, not AbortSignal.timeout: on Node 20 that signal can be garbage-collected
    // inside AbortSignal.any and never fire (nodejs/node#57736).
    let graceTimer: NodeJS.Timeout | undefined;
    const graceOver = new Promise<void>((resolve) => {
      graceTimer = setTimeout(resolve, graceMs);
      this.graceOver.signal.addEventListener("abort", () => resolve(), { once: true });
    });
    await Promise.race([finished, graceOver]);
    clearTimeout(graceTimer);
    for (const { run } of this.runs.values()) run.stop("worker_stopped");
    await finished;
    await Promise.allSettled(this.loops);

    clearInterval(this.heartbeat);
    clearInterval(this.reaper);
    for (const provider of this.options.providers) {
      if (provider.close) await this.step(`remove warm ${provider.kind} sandboxes`, () => provider.close?.() ?? Promise.resolve());
    }
    await this.step("stop listening for cancels", async () => this.cancelSub?.unsubscribe());
    await this.step("stop listening for signals", async () => this.stopSignals?.());
    await this.step("close the sessions", async () => this.sessions?.stop());
    await this.step("close the model gateway", async () => this.gateway?.close());
    // A heartbeat still in flight must land before the delete, or it would bring back a
    // presence that readers then see as gone.
    await this.beating;
    this.presenceClosed = true;
    await this.step("remove presence", async () => {
      await this.options.topology.workers.delete(this.id);
    });
    await this.step("announce stopped", () => this.announce("stopped"));
    this.state = "stopped";
    this.log.info({}, "worker stopped");
    if (this.startError === undefined) this.stopped.resolve();
    else this.stopped.reject(this.startError);
  }

  /**
   * Refreshes the presence (and so the heartbeat readers judge the worker by) and publishes a
   * `heartbeat` event. A capability probe that does not answer (say, a Docker engine that
   * hangs) must not hold the heartbeat back, or a busy worker would look gone: the presence
   * waits for it at most half a heartbeat and otherwise carries what was known.
   */
  private async beat(): Promise<void> {
    this.probing ??= this.refreshCapabilities().finally(() => {
      this.probing = undefined;
    });
    const probeWait = new AbortController();
    await Promise.race([this.probing, sleep(this.options.heartbeatMs / 2, undefined, { signal: probeWait.signal }).catch(() => {})]);
    probeWait.abort();
    await this.step("heartbeat", async () => {
      await this.putPresence();
      await this.announce("heartbeat");
    });
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
    let jobs = 0;
    for (const { slotted } of this.runs.values()) if (slotted) jobs += 1;
    return jobs + (this.sessions?.size ?? 0);
  }

  private async putPresence(): Promise<void> {
    if (this.presenceClosed) return;
    const info: WorkerInfo = {
      v: PROTOCOL_VERSION,
      id: this.id,
      host: hostname(),
      pid: process.pid,
      pools: this.options.pools,
      sandboxes: [...this.capabilities],
      policy: this.options.policy,
      capacity: this.options.concurrency,
      load: this.load,
      jobs: [...this.runs.keys()],
      state: this.state === "draining" ? "draining" : "running",
      startedAt: this.startedAt,
      heartbeatAt: nowIso(),
      heartbeatMs: this.options.heartbeatMs,
      workItems: [1, WORK_ITEM_VERSION],
      warm: this.warmReady(),
      sessionJobs: this.holdsSessions,
    };
    await this.options.topology.workers.put(this.id, JSON.stringify(info));
  }

  private async announce(type: WorkerEventType, error?: ErrorInfo): Promise<void> {
    await publishEvent(this.options.topology, {
      v: PROTOCOL_VERSION,
      at: nowIso(),
      kind: "worker",
      type,
      workerId: this.id,
      load: this.load,
      capacity: this.options.concurrency,
      ...(error ? { error } : {}),
    });
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

function deferred(): { promise: Promise<void>; resolve: () => void; reject: (err: unknown) => void } {
  let resolve: () => void = () => {};
  let reject: (err: unknown) => void = () => {};
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** The workers taking signals on each connection, and the one subscription they share. */
const signalListeners = new WeakMap<NatsConnection, { sub: Subscription; takers: Set<(msg: Msg) => boolean> }>();

/**
 * Hands the signals of `topology`'s system to `take` (true: its worker runs the job, and answers),
 * through one subscription per connection, whatever the number of workers on it: a request
 * delivered once per worker's subscription could be answered by none of them on a server with
 * authentication, which lets a client answer a request once. Returns how to stop.
 */
function listenForSignals(topology: Topology, refused: (err: Error | null) => boolean, take: (msg: Msg) => boolean): () => void {
  let listening = signalListeners.get(topology.nc);
  if (!listening) {
    const takers = new Set<(msg: Msg) => boolean>();
    const sub = topology.nc.subscribe(topology.names.subjects.signalAll, {
      callback: (err, msg) => {
        if (refused(err)) return;
        for (const taker of takers) if (taker(msg)) return;
      },
    });
    listening = { sub, takers };
    signalListeners.set(topology.nc, listening);
  }
  const { sub, takers } = listening;
  takers.add(take);
  return () => {
    takers.delete(take);
    if (takers.size > 0 || signalListeners.get(topology.nc)?.sub !== sub) return;
    signalListeners.delete(topology.nc);
    sub.unsubscribe();
  };
}
