import { randomBytes } from "node:crypto";
import { failSpan, type Logger, SpanKind, startSpan } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { isTransientJetStreamError } from "@boxcar/fabric/internal";
import {
  type AgentResultFile,
  type Artifact,
  BoxcarError,
  ErrorCode,
  type ErrorInfo,
  ownerOf,
  type ResolvedRuntime,
  type SandboxInfo,
  toErrorInfo,
  type Usage,
  type WorkItem,
} from "@boxcar/protocol";
import { jobEvent, modelsOfAgent } from "@boxcar/protocol/internal";
import type { ModelGateway } from "../gateway/gateway.js";
import { type AttemptLease, SENTINEL_EARLY_MS } from "../sandbox/lifeline.js";
import type { ExecResult, Sandbox, SandboxBackend, SandboxProvider } from "../sandbox/sandbox.js";
import type { SessionLease } from "../sessions/session-host.js";
import type { WorkerMetrics } from "../worker-metrics.js";
import type { ResolvedWorkerOptions } from "../worker-options.js";
import { agentEnv } from "../workspace/agent-contract.js";
import type { Redactor } from "../workspace/redactor.js";
import { prepareWorkspace, readResultFile, storeArtifacts, UsageFile } from "./agent-workspace.js";
import { AttemptModels } from "./attempt-models.js";
import {
  type FinalOutcome,
  failedOutcome,
  type Outcome,
  outcomeOfExit,
  outcomeOfStop,
  type StopReason,
  withUsage,
} from "./attempt-outcome.js";
import { runPromptAttempt } from "./attempt-prompt.js";
import type { JobEvents, SandboxRef } from "./job-events.js";
import type { AgentSignals } from "./job-signals.js";
import { OutputLog } from "./output-log.js";
import type { OwnedRecord } from "./owned-record.js";
import { type RoomWait, RoomWaitStoppedError } from "./room-wait.js";

/** What an attempt uses of its worker. */
export interface AttemptWorker {
  options: ResolvedWorkerOptions;
  providers: ReadonlyMap<SandboxBackend, SandboxProvider>;
  /** Where the attempt's figures go when the worker serves metrics. */
  metrics: WorkerMetrics | undefined;
  /** The model gateway, when the worker holds providers' keys: agents that list `models` call them through it. */
  gateway: Pick<ModelGateway, "open" | "reach" | "listenUnix" | "publicUrl"> | undefined;
}

/** What one attempt is given by the delivery that claimed its job. */
export interface AttemptContext {
  worker: AttemptWorker;
  /** The work item, its input taken from the record if it left it there. */
  item: WorkItem;
  /** The job's record as the attempt last wrote it (its kept signals, its deadline). */
  owned: OwnedRecord;
  /** The sandbox decided at the claim (on the record and the `started` event); undefined in a session. */
  sandbox: SandboxInfo | undefined;
  /** A job in a session: the session's sandbox, lent for this attempt; never created or destroyed here. */
  session: SessionLease | undefined;
  events: JobEvents;
  signals: AgentSignals;
  log: Logger;
  /** Takes the agent's secrets out of everything written of this attempt. */
  redactor: Redactor;
  /** The attempt's hold on its job (lifeline.ts), whose stop time the sandbox keeps too. */
  attemptLease: AttemptLease | undefined;
  /** The attempt's span, as a W3C `traceparent` for the agent, when the job is traced. */
  traceparent: string | undefined;
  /** Its output and artifacts refused for want of storage wait for room here (the run's, with its events and record). */
  room: RoomWait;
  /** Aborted once the run is stopped. */
  signal: AbortSignal;
  /** Why the run was stopped, once it was: the first reason decides how the job ends. */
  stopReason(): StopReason | undefined;
  /** Stops the run (the agent's time limit, or a lease that lapsed while it ran). */
  stop(reason: StopReason): void;
}

/**
 * One attempt of one job, from its claim to its outcome: it owns the sandbox (made here and
 * destroyed at the end, or a session's, lent), the agent's run (its command, or a prompt
 * agent's loop), its way to its models, its usage and output, and decides how it ended. It
 * writes nothing to the job's record: its `Outcome` goes to the `OutcomeWriter`.
 */
export class Attempt {
  private readonly worker: AttemptWorker;
  private readonly item: WorkItem;
  private readonly jobId: string;
  private readonly topology: Topology;
  private readonly events: JobEvents;
  private readonly log: Logger;
  private readonly redactor: Redactor;
  private readonly sandboxInfo: SandboxInfo | undefined;
  private readonly session: SessionLease | undefined;
  private readonly attemptLease: AttemptLease | undefined;
  private readonly traceparent: string | undefined;
  /** The agent's usage file, read while it runs and at its end (not for an agent whose calls the gateway meters). */
  private usageFile: UsageFile | undefined;
  /** The attempt's way to its models through the gateway, for an agent that lists `models`. */
  private models: AttemptModels | undefined;
  /** Why a prompt agent's loop ended without an answer (`max_steps`, `max_tokens`, `doom_loop`). */
  private guard: ErrorInfo | undefined;

  constructor(private readonly ctx: AttemptContext) {
    this.worker = ctx.worker;
    this.item = ctx.item;
    this.jobId = ctx.item.jobId;
    this.topology = ctx.worker.options.topology;
    this.events = ctx.events;
    this.log = ctx.log;
    this.redactor = ctx.redactor;
    this.sandboxInfo = ctx.sandbox;
    this.session = ctx.session;
    this.attemptLease = ctx.attemptLease;
    this.traceparent = ctx.traceparent;
  }

  /**
   * Runs the attempt to its outcome: the sandbox made (or the session's lent), the workspace
   * prepared, the agent run, then its usage, artifacts and result read. Throws only on NATS
   * trouble that says nothing about the job (the work item is handed back for another try).
   */
  async run(runtime: ResolvedRuntime, secrets: Map<string, string>): Promise<Outcome> {
    this.redactor.add(secrets.values());
    const ref: SandboxRef = { backend: runtime.kind, sandboxId: this.sandboxInfo?.id ?? `sbx-${randomBytes(6).toString("hex")}` };
    let sandbox: Sandbox | undefined;
    let exec: ExecResult | undefined;
    /** What the agent's calls used, once it ended: they count however the attempt ends. */
    let usage: Usage | undefined;
    try {
      sandbox = this.session ? this.session.sandbox : await this.phase("sandbox.create", () => this.createSandbox(ref));
      const box = sandbox;
      await this.phase("workspace.prepare", () => prepareWorkspace(box, this.item, this.topology.artifacts));
      await this.ctx.signals.open(sandbox, this.ctx.owned.record.signals ?? []);
      exec = await this.phase("agent.run", () => this.runAgent(box, ref, secrets)).finally(() => this.ctx.signals.close());
      // Read before anything else can fail (its artifacts, its result).
      usage = await this.endUsage();
      // Its lease lapsed while it ran (a worker frozen, or cut off from NATS), or its lifeline killed
      // it at the stop time (which a sentinel may reach a little sooner): it was stopped for that,
      // whatever its exit says, and the job may be another attempt's; nothing more is stored.
      const lease = this.attemptLease;
      if (lease && (lease.lapsed() || (exec.signal === "SIGKILL" && !exec.aborted && lease.msLeft() <= SENTINEL_EARLY_MS))) {
        this.ctx.stop("lease_lost");
      }
      // A session that closed under the job ended it, whatever its exit says.
      if (this.session?.closedWith !== undefined) throw new BoxcarError(ErrorCode.sessionLost, "the session closed");
      if (exec.aborted || this.ctx.stopReason() === "lease_lost") return withUsage(this.stopped(exec), usage);
      const outcome = await this.conclude(sandbox, exec);
      // A timeout or cancel that came while the results were read still decides how it ends.
      return withUsage(this.ctx.stopReason() ? this.stopped(exec) : outcome, usage);
    } catch (err) {
      usage ??= await this.endUsage();
      const closed = this.session?.closedWith;
      if (closed !== undefined) {
        return withUsage(
          this.failed(new BoxcarError(ErrorCode.sessionLost, `session ${this.item.session} closed while the job ran (${closed})`), exec),
          usage,
        );
      }
      // Stopped before its agent ran, or while what it had to store waited for room: ends as its stop says.
      if (this.ctx.stopReason() && (!exec || err instanceof RoomWaitStoppedError)) return withUsage(this.stopped(exec), usage);
      // NATS out of reach, or a cluster without leaders for a moment (storing the artifacts, say),
      // says nothing about the job: hand it back (the caller naks) for another try.
      if (isTransientJetStreamError(err)) throw err;
      return withUsage(this.failed(err, exec), usage);
    } finally {
      const box = sandbox;
      if (box && !this.session) await this.phase("sandbox.destroy", () => this.destroySandbox(box, ref));
    }
  }

  /**
   * One phase of the attempt as a span of its own under the attempt's (docs/observability.md#traces):
   * where an attempt's time went, in a tracing backend.
   */
  private async phase<T>(name: string, run: () => Promise<T>): Promise<T> {
    const { span } = startSpan(name, this.traceparent, { kind: SpanKind.INTERNAL, attributes: { "boxcar.job.id": this.jobId } });
    try {
      return await run();
    } catch (err) {
      failSpan(span, toErrorInfo(err));
      throw err;
    } finally {
      span.end();
    }
  }

  private async createSandbox(ref: SandboxRef): Promise<Sandbox> {
    const provider = this.worker.providers.get(ref.backend);
    if (!provider) throw new BoxcarError(ErrorCode.noSandbox, `this worker has no ${ref.backend} provider`);
    void this.events.sandbox("creating", ref);
    const startedAt = performance.now();
    const spec = {
      id: ref.sandboxId,
      jobId: this.jobId,
      attempt: this.events.attempt,
      workerId: this.worker.options.workerId,
      runtime: this.item.agent.runtime,
      // A prompt agent's tool calls are many commands in one sandbox.
      ...(this.item.agent.prompt ? { commands: "many" as const } : {}),
      ...(this.item.agent.models && this.worker.gateway?.publicUrl ? { egress: [new URL(this.worker.gateway.publicUrl).hostname] } : {}),
    };
    try {
      const sandbox = await provider.create(spec, this.ctx.signal);
      this.worker.metrics?.sandboxCreated(ref.backend, performance.now() - startedAt, sandbox.description?.start);
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
    const { options } = this.worker;
    // The attempt's own limit, or the job's overall deadline if that comes first.
    const msLeft = this.ctx.owned.msToDeadline();
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
    if (models && this.worker.gateway) {
      this.models = new AttemptModels(models, {
        gateway: this.worker.gateway,
        topology: this.topology,
        jobId: this.jobId,
        attempt: this.events.attempt,
        workerId: this.worker.options.workerId,
        traceparent: this.traceparent,
        log: this.log,
        metrics: this.worker.metrics,
        record: () => this.ctx.owned.record,
        publishApart: (event, msgID) => this.events.publishApart(event, msgID),
      });
      if (argv) argv = await this.models.prepare(sandbox, env, argv);
      else modelEnv = await this.models.prepareHere();
    }
    const output = new OutputLog({
      // A chunk the store has no room for waits for it (the later ones queue behind, up to the output kept).
      publish: (stream, data) =>
        this.ctx.room.store(
          "the agent's output",
          async () => {
            await this.topology.js.publish(this.topology.names.subjects.log(ownerOf(this.item), this.jobId, stream), data);
          },
          { bounded: true },
        ),
      maxBytes: options.maxLogBytes,
      redactor: this.redactor,
      onProgress: (message) => this.events.progress(message, this.sandboxInfo),
      onPublishError: (err) => this.log.warn({ err }, "could not store agent output"),
    });
    void this.events.sandbox("exec_started", ref);
    const timeout = setTimeout(() => this.ctx.stop(msLeft < this.item.timeoutMs ? "deadline" : "timed_out"), stopInMs);
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
            signal: this.ctx.signal,
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
      signals: this.ctx.signals.box,
      input: this.item.input,
      jobId: this.jobId,
      attempt: this.events.attempt,
      topology: this.topology,
      env,
      modelEnv,
      signal: this.ctx.signal,
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
    const artifacts: Artifact[] = [];
    if (exec.breach === undefined) {
      try {
        await this.phase("artifacts.store", () =>
          storeArtifacts(sandbox, this.jobId, this.item.agent.outputs, this.topology.artifacts, this.redactor, {
            stored: artifacts,
            // One the store has no room for waits for it, as long as the run goes on (a cancel ends the wait).
            keep: (what, put) => this.ctx.room.store(what, put, { bounded: true, signal: this.ctx.signal }),
          }),
        );
      } catch (err) {
        // Failed (the store stayed full, say): those stored whole are listed, so that they go with the job.
        if (isTransientJetStreamError(err) || err instanceof RoomWaitStoppedError) throw err;
        return { ...this.failed(err, exec), artifacts };
      }
    }
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

  /**
   * Publishes what the attempt's calls used since its report before (the first `from` lines of its
   * usage file), as a `usage` event of its own (never folded into another: the dispatchers' usage
   * consumer takes these alone and sums them per day), deduplicated by attempt and `from`.
   */
  private async reportUsage(usage: Usage, from: number): Promise<void> {
    const { record } = this.ctx.owned;
    const message = `${usage.calls} calls: ${usage.tokensIn} tokens in, ${usage.tokensOut} out, cost ${usage.cost}`;
    const attempt = this.events.attempt;
    const event = { ...jobEvent(record, "usage", { usage, message, usageBy: "agent" }), attempt, workerId: this.worker.options.workerId };
    await this.events.publishApart(event, `${this.jobId}:${attempt}:usage:${from}`);
  }

  /** The outcome of a run stopped from outside. */
  private stopped(exec: ExecResult | undefined): Outcome {
    return outcomeOfStop(this.ctx.stopReason(), exec, { timeoutMs: this.item.timeoutMs, deadlineAt: this.ctx.owned.record.deadlineAt });
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
}
