import { randomBytes } from "node:crypto";
import { failSpan, type Logger, SpanKind, startSpan, TRACEPARENT } from "@boxcar/common";
import {
  inputDigest,
  isTransientJetStreamError,
  type JobHandle,
  jobEvent,
  listJson,
  nowIso,
  publishEvent,
  type Topology,
} from "@boxcar/fabric";
import {
  type AgentResultFile,
  BoxcarError,
  checkAgentPolicy,
  ErrorCode,
  type ErrorInfo,
  isLive,
  isTerminal,
  type JobEventType,
  type JobRecord,
  JobTransitions,
  MAX_SIGNALS,
  modelsOfAgent,
  ownerOf,
  type ResolvedRuntime,
  resolveRuntime,
  type SandboxInfo,
  signalFile,
  TOKEN_PATTERN,
  toErrorInfo,
  type Usage,
  WorkerInfo,
  type WorkItem,
  whyCannotServe,
} from "@boxcar/protocol";
import type { Msg } from "@nats-io/transport-node";
import type { ModelGateway } from "../gateway/gateway.js";
import { checkModels } from "../gateway/models-check.js";
import type { WorkDelivery } from "../intake/work-delivery.js";
import { AttemptLease, SENTINEL_EARLY_MS } from "../sandbox/lifeline.js";
import type { ExecResult, Sandbox, SandboxBackend, SandboxProvider } from "../sandbox/sandbox.js";
import type { SessionHost, SessionLease } from "../sessions/session-host.js";
import type { WorkerMetrics } from "../worker-metrics.js";
import type { ResolvedWorkerOptions } from "../worker-options.js";
import { agentEnv, collectSecrets } from "../workspace/agent-contract.js";
import { Redactor } from "../workspace/redactor.js";
import { prepareWorkspace, readResultFile, storeArtifacts, UsageFile } from "./agent-workspace.js";
import { AttemptModels } from "./attempt-models.js";
import { type FinalOutcome, failedOutcome, type Outcome, outcomeOfExit, outcomeOfStop, type StopReason } from "./attempt-outcome.js";
import { runPromptAttempt } from "./attempt-prompt.js";
import { JobEvents, type SandboxRef } from "./job-events.js";
import { SignalBox } from "./job-signals.js";
import { OutputLog } from "./output-log.js";
import { planRetry, type RetryPlan } from "./retry-plan.js";

/** The most signals one job takes (each is a file of up to 64 KiB in its workspace). */
/** How long a signal that comes before the job's sandbox is ready waits for it. */
const SIGNAL_WAIT_MS = 4_000;
/** How long a job this worker cannot run waits before JetStream offers it again. */
const HAND_BACK_DELAY_MS = 1_000;
/**
 * How long a work item whose handling failed (the cluster could not be read, say) waits before
 * JetStream offers it again: 5 s more with each delivery, at most 30 s. Each offer uses one of
 * the item's deliveries, so trouble that lasts minutes does not use them all up (with the
 * default 20 deliveries it takes about 9 minutes).
 */
const failedHandlingDelayMs = (deliveries: number): number => Math.min(30_000, 5_000 * Math.max(1, deliveries));
/** Deliveries of a work item whose record cannot be found before the item is dropped. */
const MISSING_RECORD_LOOKS = 5;
/** How long a job waits before it is offered again when too many jobs wait for its session here already. */
const SESSION_BUSY_DELAY_MS = 1_000;
/** A lost outcome event is published again only this soon after the job ended (the events stream's duplicate window is 2 min). */
const REPUBLISH_WITHIN_MS = 90_000;

export interface JobRunContext {
  options: ResolvedWorkerOptions;
  /** The worker's logger. */
  log: Logger;
  /** Backends whose provider is available now. */
  capabilities(): ReadonlySet<SandboxBackend>;
  providers: ReadonlyMap<SandboxBackend, SandboxProvider>;
  /** The pool consumer's ack wait: the message is kept alive at a third of it. */
  leaseMs: number;
  /** Where the attempt's figures go when the worker serves metrics. */
  metrics: WorkerMetrics | undefined;
  /** The sessions this worker holds: a job in one (`submit --session`) runs in its sandbox. */
  sessions: Pick<SessionHost, "lend"> | undefined;
  /** The model gateway, when the worker holds providers' keys: agents that list `models` call them through it. */
  gateway: Pick<ModelGateway, "open" | "providers" | "listenUnix" | "publicUrl"> | undefined;
}

type Preflight = { ok: true; runtime: ResolvedRuntime; secrets: Map<string, string> } | { ok: false; error: ErrorInfo };

/**
 * One delivery of one work item: claims the job, runs the agent in a sandbox, records the
 * outcome and acknowledges the message. Every step that changes the job record is a
 * compare-and-swap that checks this attempt still owns the job.
 */
export class JobRun {
  readonly jobId: string;
  private readonly topology: Topology;
  private readonly abort = new AbortController();
  private readonly events: JobEvents;
  private log: Logger;
  private stopReason: StopReason | undefined;
  /** The record as this attempt last wrote it; set once the job is claimed. */
  private handle: JobHandle | undefined;
  private finishing = false;
  /** When this attempt claimed the job (performance.now()). */
  private claimedAt = 0;
  private sandboxInfo: SandboxInfo | undefined;
  /** Takes the agent's secrets out of everything written of this attempt: its events, record, output, artifacts and log lines. */
  private readonly redactor = new Redactor();
  /** The sandbox from when it is ready until the agent ends: where signals are written. */
  private agentSandbox: Sandbox | undefined;
  /** The agent's usage file, read while it runs and at its end (not for an agent whose calls the gateway meters). */
  private usageFile: UsageFile | undefined;
  /** The attempt's way to its models through the gateway, for an agent that lists `models`. */
  private models: AttemptModels | undefined;
  /** Why a prompt agent's loop ended without an answer (`max_steps`, `max_tokens`, `doom_loop`). */
  private guard: ErrorInfo | undefined;
  /** Told when the sandbox is ready: a signal that comes before waits for it. */
  private readonly sandboxReady = new Set<() => void>();
  private signals = 0;
  /** The signals so far, for a prompt agent's loop (an approval waits on one). */
  private readonly signalBox = new SignalBox();
  private agentEnded = false;
  /** The attempt's span, as a W3C `traceparent` for the agent, when the job is traced. */
  private traceparent: string | undefined;
  /** A job in a session: the session's sandbox, lent for this attempt. */
  private lease: SessionLease | undefined;
  /** How the attempt ended, once it has (its final state, or `requeue`, `fenced`). */
  private endedAs: string | undefined;
  /**
   * The attempt's hold on its job, from the delivery on (lifeline.ts): renewed at each confirmed
   * keep-alive; once it lapses the agent is stopped and the attempt writes nothing more.
   */
  private readonly attemptLease: AttemptLease | undefined;
  private lapseTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly ctx: JobRunContext,
    private readonly msg: WorkDelivery,
    private item: WorkItem,
  ) {
    this.jobId = item.jobId;
    this.topology = ctx.options.topology;
    this.attemptLease = Number.isFinite(ctx.leaseMs) ? new AttemptLease(ctx.leaseMs) : undefined;
    this.log = this.redactor.logger(ctx.log.child({ jobId: item.jobId }));
    this.events = new JobEvents(
      this.topology,
      {
        jobId: item.jobId,
        owner: ownerOf(item),
        agent: item.agent.name,
        workerId: ctx.options.workerId,
        ...(item.chain?.run ? { run: item.chain.run } : {}),
      },
      this.log,
      ctx.options.eventHoldMs,
      this.redactor,
    );
  }

  /**
   * A signal to the job (docs/flow-control.md#signals), from a dispatcher: written to the agent's
   * signals folder as `<n>-<name>.json` (`{ name, payload, at }`), then a `signal` event; the
   * dispatcher is answered with the file, or why there is none (the agent is not running).
   */
  async signal(msg: Msg): Promise<void> {
    const answer = (body: { file: string } | { error: string }) => msg.respond(JSON.stringify(this.redactor.json(body)));
    let signal: { name?: unknown; payload?: unknown };
    try {
      signal = msg.json();
    } catch {
      answer({ error: "not a signal" });
      return;
    }
    if (typeof signal.name !== "string" || !TOKEN_PATTERN.test(signal.name)) {
      answer({ error: "a signal's name is 1-64 letters, digits, '-' or '_'" });
      return;
    }
    if (this.signals >= MAX_SIGNALS) {
      answer({ error: `it has had ${MAX_SIGNALS} signals, the most a job takes` });
      return;
    }
    // Claimed but its sandbox not yet ready: the signal waits for it a little (the dispatcher waits 5 s).
    if (!this.agentSandbox && !this.stopReason && !this.agentEnded) {
      await new Promise<void>((resolve) => {
        const ready = () => {
          clearTimeout(timer);
          this.sandboxReady.delete(ready);
          resolve();
        };
        const timer = setTimeout(ready, SIGNAL_WAIT_MS);
        this.sandboxReady.add(ready);
      });
    }
    const sandbox = this.agentSandbox;
    if (!sandbox || this.stopReason) {
      answer({ error: "its agent is not running (it is starting, or ending)" });
      return;
    }
    const file = signalFile(++this.signals, signal.name);
    try {
      await sandbox.writeFile(file, Buffer.from(JSON.stringify({ name: signal.name, payload: signal.payload ?? null, at: nowIso() })));
    } catch (err) {
      answer({ error: `could not write the signal: ${(err as Error).message}` });
      return;
    }
    this.signalBox.add({ name: signal.name, payload: signal.payload ?? null });
    void this.events.job("signal", "running", { message: `signal ${signal.name} in ${file}` });
    answer({ file });
  }

  /**
   * Writes the signals sent to the job before this attempt began (kept in its record, as it was
   * claimed), in the order they came, before its agent starts: every attempt's agent finds them.
   */
  private async writeKeptSignals(sandbox: Sandbox): Promise<void> {
    for (const signal of this.handle?.record.signals ?? []) {
      await sandbox.writeFile(signalFile(++this.signals, signal.name), Buffer.from(JSON.stringify(signal)));
      this.signalBox.add({ name: signal.name, payload: signal.payload });
    }
  }

  /** Stops the run; the first reason decides how the job ends. */
  stop(reason: StopReason): void {
    if (this.stopReason) return;
    this.stopReason = reason;
    for (const waiting of this.sandboxReady) waiting(); // signals waiting for the sandbox are refused now
    this.log.info({ reason }, "stopping job");
    this.abort.abort();
  }

  /** Handles the message to the end; never rejects. */
  async run(): Promise<void> {
    const keepAlive = setInterval(() => this.keepAlive(), this.ctx.leaseMs / 3);
    this.watchLapse();
    try {
      await this.process();
    } catch (err) {
      const delayMs = failedHandlingDelayMs(this.msg.deliveryCount);
      this.log.error({ err, delayMs }, "job handling failed; handing the work item back");
      this.nak(delayMs);
    } finally {
      clearInterval(keepAlive);
      clearTimeout(this.lapseTimer);
      this.lease?.release(this.endedAs ?? "handed back");
      // An attempt that ended without its last event (fenced, or handed back on an error) keeps the rest.
      this.events.goLive();
    }
  }

  private async process(): Promise<void> {
    const found = await this.topology.jobStore.read(this.jobId);
    if (!found) {
      // Admission writes the record before the item, so a missing record is a read that came too
      // early (or a job deleted since): look a few more times before dropping the item.
      if (this.msg.deliveryCount < MISSING_RECORD_LOOKS) {
        this.log.warn({}, "no job record for this work item yet; looking again shortly");
        return this.nak(HAND_BACK_DELAY_MS);
      }
      this.log.warn({}, "no job record for this work item; dropping it");
      return this.ack();
    }
    if (this.stopReason === "worker_stopped") return this.nak();

    const wrongInput = this.takeInput(found.record);
    let preflight: Preflight;
    if (wrongInput) preflight = { ok: false, error: wrongInput };
    else if (this.item.session === undefined || isTerminal(found.record.state)) preflight = this.preflight();
    else {
      const lent = await this.borrowSession(this.item.session);
      if (lent === "busy") return this.nak(SESSION_BUSY_DELAY_MS);
      preflight = lent;
    }
    // Handed back for another worker of the pool, unless it is a job of a session here (none other can run it).
    if (!preflight.ok && preflight.error.code === ErrorCode.noSandbox && !isTerminal(found.record.state) && !this.item.session) {
      const other = await this.capableWorker(found.record.pool);
      if (other) {
        // Not for this worker: hand it back (after a pause) for one that can run it.
        this.log.info({ capableWorker: other, reason: preflight.error.message }, "cannot run this job here; handing it back");
        this.nak(HAND_BACK_DELAY_MS);
        return;
      }
    }
    const now = nowIso();
    // The sandbox decision goes on the record and the `started` event before anything is created.
    const decided: SandboxInfo | undefined = !preflight.ok
      ? undefined
      : this.lease
        ? { ...this.lease.info, reason: preflight.runtime.reason }
        : { kind: preflight.runtime.kind, id: `sbx-${randomBytes(6).toString("hex")}`, reason: preflight.runtime.reason };
    // A delivery whose lease lapsed meanwhile (its worker frozen) is another's by now: no claim.
    if (this.attemptLease?.lapsed()) return;
    const claim = await this.topology.jobStore.change(found, (current) =>
      JobTransitions.claim(current, {
        workerId: this.ctx.options.workerId,
        now,
        ...(preflight.ok ? { sandbox: decided } : { refusal: preflight.error }),
      }),
    );
    if (!claim.written) {
      this.log.info({ state: claim.current?.record.state }, "job is not waiting to run; dropping the work item");
      if (claim.current) await this.republishOutcome(claim.current.record);
      return this.ack();
    }

    const record = claim.handle.record;
    this.events.attempt = record.attempt;
    this.log = this.log.child({ attempt: record.attempt });
    if (!preflight.ok || record.state !== "running") {
      const state = record.state === "cancelled" || record.state === "expired" || record.state === "timed_out" ? record.state : "failed";
      await this.events.job(state, state, record.error ? { error: record.error, message: record.error.message } : {});
      this.log.info({ state, error: record.error }, "job ended before it started");
      return this.ack();
    }

    this.handle = claim.handle;
    this.sandboxInfo = decided;
    this.claimedAt = performance.now();
    // The attempt joins the job's trace: from the work item's header, else the record.
    const attemptSpan = startSpan("job.attempt", this.msg.headers?.get(TRACEPARENT) || record.traceparent, {
      kind: SpanKind.CONSUMER,
      attributes: {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.destination.name": this.msg.subject,
        "messaging.message.id": this.jobId,
        "boxcar.job.id": this.jobId,
        "boxcar.agent": record.agent,
        "boxcar.attempt": record.attempt,
        "boxcar.sandbox.kind": preflight.runtime.kind,
        "boxcar.worker.id": this.ctx.options.workerId,
      },
    });
    this.traceparent = attemptSpan.traceparent;
    try {
      this.endedAs = await this.runClaimed(record, preflight, decided);
    } finally {
      const { endedAs } = this;
      attemptSpan.span.setAttribute("boxcar.job.state", endedAs ?? "unknown");
      if (endedAs !== "succeeded" && endedAs !== "requeue") {
        failSpan(attemptSpan.span, { message: `the attempt ended ${endedAs ?? "without an outcome"}` });
      }
      attemptSpan.span.end();
    }
  }

  /** Runs the claimed attempt to its end; resolves with how it ended (its final state, or `requeue`, `fenced`). */
  private async runClaimed(
    record: JobRecord,
    preflight: Extract<Preflight, { ok: true }>,
    decided: SandboxInfo | undefined,
  ): Promise<string> {
    this.ctx.metrics?.claimed(record.pool, record.queuedAt, record.startedAt);
    const removed = record.attempt > 1 && !this.lease ? await this.removeEarlierAttempts(record.attempt) : 0;
    const { takeover } = record;
    // The record says how the attempt taken over is known to be gone: its lease, or its sandbox removed too.
    if (takeover && removed > 0) await this.updateOwned((current) => ({ ...current, takeover: { ...takeover, stopped: "removed" } }));
    await this.lease?.begin();
    // Stored before the agent runs: an attempt that ran has its start in the history, even when
    // its worker dies right after (a chaos run in CI found one that ran with no `started`).
    const tookOver = takeover
      ? `takes over attempt ${takeover.attempt}${takeover.workerId ? ` of worker ${takeover.workerId}` : ""}, whose lease lapsed${removed > 0 ? `; its sandbox was found and removed` : ""}`
      : undefined;
    await this.events.job("started", "running", { ...(decided ? { sandbox: decided } : {}), ...(tookOver ? { message: tookOver } : {}) });
    this.log.info({ sandbox: preflight.runtime.kind }, "job started");
    const outcome = await this.execute(preflight.runtime, preflight.secrets);
    this.finishing = true;
    await this.finish(outcome);
    return outcome.kind === "final" ? outcome.state : outcome.kind;
  }

  /**
   * A job whose work item comes back after it ended: its worker may have died between writing
   * the outcome and publishing its event. The event is published again; the events stream drops
   * it if it was stored (same message id), so only within its duplicate window.
   */
  private async republishOutcome(record: JobRecord): Promise<void> {
    if (!isTerminal(record.state) || record.attempt === 0 || !record.finishedAt) return;
    if (Date.now() - Date.parse(record.finishedAt) > REPUBLISH_WITHIN_MS) return;
    // A final state is also the type of the event that announces it.
    const event = jobEvent(record, record.state as JobEventType, {
      ...(record.workerId ? { workerId: record.workerId } : {}),
      ...(record.sandbox ? { sandbox: record.sandbox } : {}),
      ...(record.error ? { message: record.error.message } : {}),
    });
    await publishEvent(this.topology, event).catch((err: unknown) => this.log.warn({ err }, "could not publish the outcome event again"));
  }

  /**
   * Another live worker of the pool that can run this agent, if any. A presence list that cannot
   * be read (a cluster electing leaders, say) throws, and the item is handed back: reading it as
   * "no such worker" would fail a job another worker could run.
   */
  private async capableWorker(pool: string): Promise<string | undefined> {
    const workers = await listJson(this.topology.workers, WorkerInfo, "worker");
    return workers.find(
      (w) =>
        w.id !== this.ctx.options.workerId &&
        w.state === "running" &&
        w.pools.includes(pool) &&
        isLive(w) &&
        whyCannotServe(w, this.item.agent) === undefined,
    )?.id;
  }

  /**
   * A version 2 work item leaves the input in the job record: it is taken from there only if it
   * is the input the dispatcher signed for (by digest), whoever else may write records. Returns
   * why the job cannot run when it is not.
   */
  private takeInput(record: JobRecord): ErrorInfo | undefined {
    if (this.item.v === 1) return undefined;
    const input = record.spec?.input;
    if (record.spec && inputDigest(input) === this.item.inputDigest) {
      this.item = { ...this.item, input };
      return undefined;
    }
    return toErrorInfo(
      new BoxcarError(ErrorCode.invalid, "the job record's input is not the one its signed work item names (by digest); it was not run"),
    );
  }

  /**
   * A new attempt of a job whose worker crashed or froze: the sandboxes of its earlier attempts
   * that this worker's backends can reach are removed before this one starts, so the agent does
   * not run twice at once (the reaper finds those on other engines once their worker is gone).
   */
  private async removeEarlierAttempts(attempt: number): Promise<number> {
    let all = 0;
    for (const provider of this.ctx.providers.values()) {
      if (!provider.removeEarlierAttempts || !this.ctx.capabilities().has(provider.kind)) continue;
      const removed = await provider.removeEarlierAttempts(this.jobId, attempt).catch((err: unknown) => {
        this.log.warn({ err, backend: provider.kind }, "could not look for sandboxes of earlier attempts");
        return 0;
      });
      if (removed > 0) this.log.warn({ backend: provider.kind, removed }, "removed sandboxes of earlier attempts that were still there");
      all += removed;
    }
    return all;
  }

  /**
   * A job in a session: the session's sandbox, lent for this attempt (its lock held until the
   * attempt ends), or why the job cannot run in it; `busy` while a command or another job has it.
   */
  private async borrowSession(id: string): Promise<Preflight | "busy"> {
    const { agent } = this.item;
    try {
      checkAgentPolicy(agent, this.ctx.options.agentPolicy, "this worker's policy");
      if (!this.ctx.sessions) throw new BoxcarError(ErrorCode.sessionLost, `worker ${this.ctx.options.workerId} holds no sessions`);
      // The agent must be one this worker would run in such a sandbox (an untrusted one never on the host, say).
      const own = resolveRuntime(agent.runtime, agent.trusted, this.ctx.capabilities(), this.ctx.options.policy);
      const lease = await this.ctx.sessions.lend(
        id,
        { jobId: this.jobId, owner: ownerOf(this.item), agent, runtime: own },
        this.abort.signal,
      );
      this.lease = lease;
      const stopped = () => {
        // Cancelled by the session's owner; else the session closed: its sandbox goes, and the job fails `session_lost`.
        if (lease.cancelled) this.stop("cancelled");
        else this.abort.abort();
      };
      lease.stopped.addEventListener("abort", stopped, { once: true });
      if (lease.stopped.aborted) stopped();
      // The session's secrets go to its own agent's jobs only: another agent's job gets none of them.
      const secrets = lease.agent === agent.name ? lease.secrets : new Map<string, string>();
      return { ok: true, runtime: { kind: lease.info.kind, reason: `the sandbox of session ${id}` }, secrets };
    } catch (err) {
      // Too many waiting, or this run was stopped while it waited: handed back.
      if ((err instanceof BoxcarError && err.code === ErrorCode.conflict) || this.stopReason) return "busy";
      return { ok: false, error: toErrorInfo(err) };
    }
  }

  /** What can fail before anything starts: the worker's policy refuses the agent, no sandbox fits, or a secret is missing. */
  private preflight(): Preflight {
    try {
      checkAgentPolicy(this.item.agent, this.ctx.options.agentPolicy, "this worker's policy");
      const runtime = resolveRuntime(this.item.agent.runtime, this.item.agent.trusted, this.ctx.capabilities(), this.ctx.options.policy);
      checkModels(modelsOfAgent(this.item.agent), this.item.agent.prompt ? undefined : runtime.kind, this.ctx.gateway);
      return { ok: true, runtime, secrets: collectSecrets(this.item.agent, this.ctx.options.secretsEnv) };
    } catch (err) {
      return { ok: false, error: toErrorInfo(err) };
    }
  }

  private async execute(runtime: ResolvedRuntime, secrets: Map<string, string>): Promise<Outcome> {
    this.redactor.add(secrets.values());
    const ref: SandboxRef = { backend: runtime.kind, sandboxId: this.sandboxInfo?.id ?? `sbx-${randomBytes(6).toString("hex")}` };
    let sandbox: Sandbox | undefined;
    let exec: ExecResult | undefined;
    /** What the agent's calls used, once it ended: they count however the attempt ends. */
    let usage: Usage | undefined;
    try {
      sandbox = this.lease ? this.lease.sandbox : await this.createSandbox(ref);
      await prepareWorkspace(sandbox, this.item, this.topology.artifacts);
      await this.writeKeptSignals(sandbox);
      this.agentSandbox = sandbox;
      for (const ready of this.sandboxReady) ready();
      exec = await this.runAgent(sandbox, ref, secrets).finally(() => {
        this.agentSandbox = undefined;
        this.agentEnded = true;
      });
      // Read before anything else can fail (its artifacts, its result).
      usage = await this.endUsage();
      // Its lease lapsed while it ran (a worker frozen, or cut off from NATS), or its lifeline killed
      // it at the stop time (which a sentinel may reach a little sooner): it was stopped for that,
      // whatever its exit says, and the job may be another attempt's; nothing more is stored.
      const lease = this.attemptLease;
      if (lease && (lease.lapsed() || (exec.signal === "SIGKILL" && !exec.aborted && lease.msLeft() <= SENTINEL_EARLY_MS))) {
        this.stop("lease_lost");
      }
      // A session that closed under the job ended it, whatever its exit says.
      if (this.lease?.closedWith !== undefined) throw new BoxcarError(ErrorCode.sessionLost, "the session closed");
      if (exec.aborted || this.stopReason === "lease_lost") return withUsage(this.stopped(exec), usage);
      const outcome = await this.conclude(sandbox, exec);
      // A timeout or cancel that came while the results were read still decides how it ends.
      return withUsage(this.stopReason ? this.stopped(exec) : outcome, usage);
    } catch (err) {
      usage ??= await this.endUsage();
      const closed = this.lease?.closedWith;
      if (closed !== undefined) {
        return withUsage(
          this.failed(new BoxcarError(ErrorCode.sessionLost, `session ${this.item.session} closed while the job ran (${closed})`), exec),
          usage,
        );
      }
      if (this.stopReason && !exec) return withUsage(this.stopped(undefined), usage);
      // NATS out of reach, or a cluster without leaders for a moment (storing the artifacts, say),
      // says nothing about the job: hand it back (the caller naks) for another try.
      if (isTransientJetStreamError(err)) throw err;
      return withUsage(this.failed(err, exec), usage);
    } finally {
      if (sandbox && !this.lease) await this.destroySandbox(sandbox, ref);
    }
  }

  private async createSandbox(ref: SandboxRef): Promise<Sandbox> {
    const provider = this.ctx.providers.get(ref.backend);
    if (!provider) throw new BoxcarError(ErrorCode.noSandbox, `this worker has no ${ref.backend} provider`);
    void this.events.sandbox("creating", ref);
    const startedAt = performance.now();
    const spec = {
      id: ref.sandboxId,
      jobId: this.jobId,
      attempt: this.events.attempt,
      workerId: this.ctx.options.workerId,
      runtime: this.item.agent.runtime,
      // A prompt agent's tool calls are many commands in one sandbox.
      ...(this.item.agent.prompt ? { commands: "many" as const } : {}),
      ...(this.item.agent.models && this.ctx.gateway?.publicUrl ? { egress: [new URL(this.ctx.gateway.publicUrl).hostname] } : {}),
    };
    try {
      const sandbox = await provider.create(spec, this.abort.signal);
      this.ctx.metrics?.sandboxCreated(ref.backend, performance.now() - startedAt, sandbox.description?.start);
      void this.events.sandbox("ready", ref, { durationMs: performance.now() - startedAt, ...sandbox.description });
      return sandbox;
    } catch (cause) {
      // A precise refusal (a missing image, a bad limit or network) keeps its code.
      const error =
        cause instanceof BoxcarError
          ? cause
          : new BoxcarError(ErrorCode.sandboxFailed, `could not create a ${ref.backend} sandbox: ${(cause as Error).message}`, { cause });
      await this.events.sandbox("failed", ref, { durationMs: performance.now() - startedAt, error: toErrorInfo(error) });
      throw error;
    }
  }

  private async runAgent(sandbox: Sandbox, ref: SandboxRef, secrets: Map<string, string>): Promise<ExecResult> {
    const { options } = this.ctx;
    // The attempt's own limit, or the job's overall deadline if that comes first.
    const msLeft = this.msToDeadline();
    const stopInMs = Math.min(this.item.timeoutMs, msLeft);
    const env = agentEnv({
      item: this.item,
      attempt: this.events.attempt,
      workspace: sandbox.workspace,
      path: sandbox.agentPath ?? options.agentPath,
      secrets,
      stopAt: Date.now() + stopInMs,
      ...(this.traceparent ? { traceparent: this.traceparent } : {}),
      tracing: options.agentTracing,
    });
    // An agent that calls its models through the gateway gets its base URLs and a token for this
    // attempt (never a key), and the gateway meters its calls: its usage file is not read.
    // A prompt agent has no command: its loop runs here, calling the gateway with the attempt's token.
    let argv = this.item.agent.command;
    let modelEnv: Record<string, string> = {};
    const models = modelsOfAgent(this.item.agent);
    if (models && this.ctx.gateway) {
      this.models = new AttemptModels(models, {
        gateway: this.ctx.gateway,
        topology: this.topology,
        jobId: this.jobId,
        attempt: this.events.attempt,
        workerId: this.ctx.options.workerId,
        traceparent: this.traceparent,
        log: this.log,
        metrics: this.ctx.metrics,
        record: () => this.handle?.record,
        publishApart: (event, msgID) => this.events.publishApart(event, msgID),
      });
      if (argv) argv = await this.models.prepare(sandbox, env, argv);
      else modelEnv = await this.models.prepareHere();
    }
    const output = new OutputLog({
      publish: async (stream, data) => {
        await this.topology.js.publish(this.topology.names.subjects.log(ownerOf(this.item), this.jobId, stream), data);
      },
      maxBytes: options.maxLogBytes,
      redactor: this.redactor,
      onProgress: (message) => this.events.progress(message, this.sandboxInfo),
      onPublishError: (err) => this.log.warn({ err }, "could not store agent output"),
    });
    void this.events.sandbox("exec_started", ref);
    const timeout = setTimeout(() => this.stop(msLeft < this.item.timeoutMs ? "deadline" : "timed_out"), stopInMs);
    // Its calls count as it makes them: its usage file is read every so often while it runs.
    const usage = this.models ? undefined : new UsageFile(sandbox, (used, from) => this.reportUsage(used, from));
    this.usageFile = usage;
    const reading = setInterval(() => {
      usage
        ?.read()
        .catch((err: unknown) => this.log.warn({ err }, "could not read or report the agent's usage file; reading it again later"));
    }, options.usageReadMs);
    let exec: ExecResult;
    try {
      exec = argv
        ? await sandbox.exec(argv, {
            env,
            signal: this.abort.signal,
            ...(this.attemptLease ? { attemptLease: this.attemptLease } : {}),
            onOutput: (stream, chunk) => output.write(stream, chunk),
          })
        : await this.runPrompt(sandbox, env, modelEnv, output);
    } finally {
      clearTimeout(timeout);
      clearInterval(reading);
      await output.close();
    }
    void this.events.sandbox("exec_exited", ref, {
      durationMs: exec.durationMs,
      exitCode: exec.exitCode,
      signal: exec.signal,
      ...(exec.oomKilled !== undefined ? { oomKilled: exec.oomKilled } : {}),
      ...(exec.usage ? { usage: exec.usage } : {}),
    });
    return exec;
  }

  /** A prompt agent's loop (docs/harness.md), in place of a command; a guard that ended it is kept for its outcome. */
  private async runPrompt(sandbox: Sandbox, env: Record<string, string>, modelEnv: Record<string, string>, output: OutputLog) {
    const agent = this.item.agent.prompt;
    if (!agent) throw new BoxcarError(ErrorCode.internal, "the agent has neither a command nor a prompt");
    const { exec, guard } = await runPromptAttempt(sandbox, {
      agent,
      handoffs: this.item.agent.handoffs,
      signals: this.signalBox,
      input: this.item.input,
      jobId: this.jobId,
      attempt: this.events.attempt,
      topology: this.topology,
      env,
      modelEnv,
      signal: this.abort.signal,
      attemptLease: this.attemptLease,
      event: (type, step, message) => void this.events.job(type, "running", { step, message }),
      onText: (text) => output.write("stdout", new TextEncoder().encode(text)),
      progress: (message) => this.events.progress(message, this.sandboxInfo),
      log: this.log,
    });
    this.guard = guard;
    return exec;
  }

  /** The outcome of an agent that ended on its own: artifacts, then its result file and exit code. */
  private async conclude(sandbox: Sandbox, exec: ExecResult): Promise<Outcome> {
    // A workspace past its quota is not stored: its files are what the quota keeps out.
    const artifacts =
      exec.breach === undefined
        ? await storeArtifacts(sandbox, this.jobId, this.item.agent.outputs, this.topology.artifacts, this.redactor)
        : [];
    let file: AgentResultFile | undefined;
    try {
      file = await readResultFile(sandbox);
    } catch (err) {
      return { ...this.failed(err, exec), artifacts };
    }
    const outcome = outcomeOfExit(exec, file, artifacts, sandbox.description?.limits?.memory);
    // A prompt agent's loop ended by a guard fails with the guard's own code.
    return this.guard && outcome.state === "failed" ? { ...outcome, error: this.guard, message: this.guard.message } : outcome;
  }

  /**
   * What the attempt's calls used, all told, once the agent ended (the rest reported): as the
   * gateway metered them (its pass ends here, and its token with it), else as its usage file
   * says; a usage file that cannot be read counts nothing more.
   */
  private async endUsage(): Promise<Usage | undefined> {
    if (this.models) return this.models.end();
    return this.usageFile
      ?.end((err) => this.log.error({ err }, "could not report the attempt's usage"))
      .catch((err: unknown) => {
        this.log.warn({ err }, "could not read the agent's usage file");
        return undefined;
      });
  }

  /** The outcome of a run stopped from outside. */
  private stopped(exec: ExecResult | undefined): Outcome {
    return outcomeOfStop(this.stopReason, exec, { timeoutMs: this.item.timeoutMs, deadlineAt: this.handle?.record.deadlineAt });
  }

  private failed(err: unknown, exec: ExecResult | undefined): FinalOutcome {
    if (!(err instanceof BoxcarError)) this.log.error({ err }, "job failed on an unexpected error");
    return failedOutcome(toErrorInfo(err), exec);
  }

  private async destroySandbox(sandbox: Sandbox, ref: SandboxRef): Promise<void> {
    const startedAt = performance.now();
    try {
      await sandbox.destroy();
      // Stored before the outcome event, which is awaited: the publishes keep their order.
      void this.events.sandbox("destroyed", ref, { durationMs: performance.now() - startedAt });
    } catch (cause) {
      this.log.error({ err: cause, sandboxId: ref.sandboxId }, "could not destroy the sandbox");
      const error = new BoxcarError(ErrorCode.sandboxFailed, `could not destroy sandbox ${ref.sandboxId}: ${(cause as Error).message}`);
      void this.events.sandbox("failed", ref, { durationMs: performance.now() - startedAt, error: toErrorInfo(error) });
    }
  }

  private async finish(reported: Outcome): Promise<void> {
    // Everything the attempt reports comes from here (its result, handoff, artifacts' names,
    // error, usage): redacted once, whatever field it is in.
    let outcome = this.redactor.json(reported);
    // Past its lease, another attempt may own the job: this one writes nothing.
    if (this.attemptLease?.lapsed()) outcome = { kind: "fenced" };
    if (outcome.kind === "requeue" && this.lease) {
      // Nothing else can run it: the session closes with this worker.
      const error = new BoxcarError(
        ErrorCode.sessionLost,
        `worker ${this.ctx.options.workerId} stopped while the job ran; session ${this.item.session} closes with it`,
      );
      outcome = withUsage(failedOutcome(toErrorInfo(error), undefined), outcome.usage);
    }
    if (outcome.kind === "fenced") {
      this.log.warn({ reason: this.stopReason }, "another attempt owns the job now, or may soon; leaving its record and work item alone");
      return;
    }
    if (outcome.kind === "final" && (outcome.state === "failed" || outcome.state === "timed_out")) {
      const attempt = this.events.attempt;
      const plan = planRetry(
        this.item.retry,
        { ...outcome, state: outcome.state },
        attempt,
        this.handle?.record.attemptsAllowed ?? 1,
        this.msToDeadline(),
      );
      if (plan.kind !== "final") return this.retryOrBury(outcome, outcome.state, plan);
      if (plan.note) outcome = { ...outcome, message: `${outcome.message ?? outcome.state}; ${plan.note}` };
    }
    const now = nowIso();
    const update =
      outcome.kind === "requeue"
        ? await this.updateOwned((current) => JobTransitions.handBack(current, now))
        : await this.updateOwned((current) => JobTransitions.finish(current, this.attemptEnd(outcome, outcome.state, now)));
    if (!update) return this.leave();

    this.attemptEnded(outcome.kind === "requeue" ? "requeued" : outcome.state, outcome.kind === "final" ? outcome : undefined);
    if (outcome.kind === "requeue") {
      const error = { code: ErrorCode.workerStopped, message: "the worker stopped while the job ran; it goes back to the queue" };
      await this.events.job("requeued", "queued", { error, message: error.message });
      this.log.info({}, "job handed back to the queue");
      this.nak();
      return;
    }
    const sandbox = this.sandboxInfo;
    await this.events.job(outcome.state, outcome.state, {
      ...(sandbox ? { sandbox } : {}),
      ...(outcome.message !== undefined ? { message: outcome.message } : {}),
      ...(outcome.error ? { error: outcome.error } : {}),
    });
    this.log.info({ state: outcome.state, error: outcome.error }, "job finished");
    await this.ack();
  }

  /**
   * Publishes what the attempt's calls used since its report before (the first `from` lines of its
   * usage file), as a `usage` event of its own (never folded into another: the dispatchers' usage
   * consumer takes these alone and sums them per day), deduplicated by attempt and `from`.
   */
  private async reportUsage(usage: Usage, from: number): Promise<void> {
    const record = this.handle?.record;
    if (!record) return;
    const message = `${usage.calls} calls: ${usage.tokensIn} tokens in, ${usage.tokensOut} out, cost ${usage.cost}`;
    const attempt = this.events.attempt;
    const event = { ...jobEvent(record, "usage", { usage, message, usageBy: "agent" }), attempt, workerId: this.ctx.options.workerId };
    await this.events.publishApart(event, `${this.jobId}:${attempt}:usage:${from}`);
  }

  private attemptEnded(name: string, outcome: FinalOutcome | undefined): void {
    this.ctx.metrics?.attemptEnded(this.item.agent.name, this.handle?.record.pool ?? "", name, {
      ms: performance.now() - this.claimedAt,
      cpuMs: outcome?.result?.usage?.cpuMs,
      artifactBytes: outcome?.artifacts.reduce((sum, a) => sum + a.size, 0) ?? 0,
    });
  }

  /**
   * A failed attempt the retry policy covers: back to the queue after a backoff (the work item is
   * redelivered then), or, attempts exhausted, the job ends `dead` and its record goes to the
   * dead-letter stream. Either way the attempt is kept in the record's history.
   */
  private async retryOrBury(
    outcome: FinalOutcome,
    state: "failed" | "timed_out",
    plan: RetryPlan & { kind: "retry" | "dead" },
  ): Promise<void> {
    const now = nowIso();
    const attempt = this.events.attempt;
    const ended = {
      attempt,
      state,
      workerId: this.ctx.options.workerId,
      finishedAt: now,
      ...(outcome.error ? { error: outcome.error } : {}),
    };
    const update = await this.updateOwned((current) =>
      JobTransitions.endAttempt(current, ended, this.attemptEnd(outcome, state, now), plan.kind),
    );
    if (!update) return this.leave();
    this.attemptEnded(plan.kind === "retry" ? "retrying" : "dead", outcome);
    const allowed = update.attemptsAllowed ?? attempt;
    const why = outcome.error?.message ?? state;
    if (plan.kind === "retry") {
      const message = `attempt ${attempt} of ${allowed} ${state === "timed_out" ? "timed out" : "failed"} (${why}); retrying in ${plan.delayMs} ms`;
      await this.events.job("retrying", "queued", { message, ...(outcome.error ? { error: outcome.error } : {}) });
      this.log.info({ delayMs: plan.delayMs, error: outcome.error }, "attempt failed; retrying");
      this.nak(plan.delayMs);
      return;
    }
    // Attempts taken over (their worker died, froze or lost NATS) left no outcome in the history.
    const failed = update.history.filter((h) => h.state === "failed" || h.state === "timed_out").length;
    const cutShort = Math.max(0, attempt - failed);
    const message =
      cutShort > 0
        ? `all ${attempt} attempts ended without success: ${failed} failed, ${cutShort} cut short (their worker died, froze or lost NATS); the last: ${why}`
        : `all ${allowed} attempts failed; the last: ${why}`;
    await this.events.job("dead", "dead", { message, ...(outcome.error ? { error: outcome.error } : {}) });
    await this.topology.js
      .publish(this.topology.names.subjects.dead(update.agent), JSON.stringify(update))
      .catch((err: unknown) => this.log.error({ err }, "could not keep the dead job in the dead-letter stream"));
    this.log.warn({ error: outcome.error }, "job is dead: its attempts are exhausted");
    await this.ack();
  }

  private attemptEnd(outcome: FinalOutcome, state: JobTransitions.AttemptState, now: string): JobTransitions.AttemptEnd {
    const { retryAfterMs, usage } = outcome;
    return {
      ...(usage ? { usage } : {}),
      ...(retryAfterMs !== undefined ? { providerLimitedUntil: new Date(Date.parse(now) + retryAfterMs).toISOString() } : {}),
      state,
      now,
      artifacts: outcome.artifacts,
      ...(this.sandboxInfo ? { sandbox: this.sandboxInfo } : {}),
      ...(outcome.result ? { result: outcome.result } : {}),
      ...(outcome.error ? { error: outcome.error } : {}),
    };
  }

  /** The record changed hands: a finished job's work item is done, another attempt's is not ours. */
  private async leave(): Promise<void> {
    const current = await this.topology.jobStore.read(this.jobId);
    if (!current || isTerminal(current.record.state)) {
      this.log.warn({ state: current?.record.state }, "the job ended elsewhere; dropping this attempt's outcome");
      return this.ack();
    }
    this.log.warn({ state: current.record.state, attempt: current.record.attempt }, "another attempt owns the job now; leaving it alone");
  }

  /** Applies `change` to the record while this attempt owns it; null once it does not. */
  private async updateOwned(change: (current: JobRecord) => JobRecord): Promise<JobRecord | null> {
    if (!this.handle) return null;
    const update = await this.topology.jobStore.change(this.handle, (current) => (this.owns(current) ? change(current) : null));
    if (!update.written) return null;
    this.handle = update.handle;
    return update.handle.record;
  }

  /** Time left before the job's overall deadline (infinite without one). */
  private msToDeadline(): number {
    const deadlineAt = this.handle?.record.deadlineAt;
    return deadlineAt ? Date.parse(deadlineAt) - Date.now() : Number.POSITIVE_INFINITY;
  }

  private owns(record: JobRecord): boolean {
    return JobTransitions.isOwnedBy(record, this.ctx.options.workerId, this.events.attempt);
  }

  /** Stops the attempt when its lease lapses: at its stop time, unless renewed by then (then looks again at the new one). */
  private watchLapse(): void {
    const lease = this.attemptLease;
    if (!lease) return;
    this.lapseTimer = setTimeout(
      () => {
        if (!lease.lapsed()) return this.watchLapse();
        this.log.warn(
          { leaseMs: lease.leaseMs, stopAfterMs: lease.stopAfterMs },
          "the job's lease was not confirmed in time; stopping its agent",
        );
        this.stop("lease_lost");
      },
      Math.max(0, lease.msLeft()),
    );
  }

  /** Keeps the message from being redelivered, and notices a cancel or takeover in the record. */
  private keepAlive(): void {
    // A lapsed attempt touches nothing: its work item may be another attempt's delivery by now.
    if (this.attemptLease?.lapsed()) return;
    const sentAt = performance.now();
    this.msg.working();
    this.topology.jobStore.read(this.jobId).then(
      (found) => {
        // Not claimed yet (or no longer there): the answer confirms the renewal all the same.
        if (!this.handle || !found) return this.attemptLease?.renewed(sentAt);
        const owned = this.owns(found.record);
        // The read came back: NATS took the renewal too (sent before it, on the same connection).
        if (owned) this.attemptLease?.renewed(sentAt);
        if (this.finishing) return;
        if (!owned) this.stop("fenced");
        else if (found.record.cancelRequested) this.stop("cancelled");
      },
      (err: unknown) => this.log.warn({ err }, "could not read the job record"),
    );
  }

  /**
   * Hands the work item back (after `delayMs`). Not once the lease lapsed: JetStream settles a
   * message by its stream sequence, so a stale attempt's nak or ack would settle the delivery of
   * the attempt that took over.
   */
  private nak(delayMs?: number): void {
    if (this.attemptLease?.lapsed()) {
      this.log.warn({}, "the lease lapsed: leaving the work item to JetStream");
      return;
    }
    this.msg.nak(delayMs);
  }

  private async ack(): Promise<void> {
    if (this.attemptLease?.lapsed()) return this.log.warn({}, "the lease lapsed: leaving the work item to JetStream");
    try {
      this.msg.ack();
    } catch (err) {
      this.log.warn({ err }, "could not acknowledge the work item");
    }
  }
}

/** `outcome` with the attempt's usage, when it reported some. */
function withUsage(outcome: Outcome, usage: Usage | undefined): Outcome {
  return usage && outcome.kind !== "fenced" ? { ...outcome, usage } : outcome;
}
