import { join } from "node:path";
import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { getJson } from "@boxcar/fabric/internal";
import {
  type AgentModels,
  BoxcarError,
  ErrorCode,
  type JobEvent,
  type JobRecord,
  type ModelCall,
  ownerOf,
  SystemPolicy,
  type Usage,
} from "@boxcar/protocol";
import { jobEvent, POLICY_KEY, priceOf } from "@boxcar/protocol/internal";
import { type CallLimiter, kvCallLimiter } from "../gateway/call-limits.js";
import { FORWARD_PORT, FORWARDER_SCRIPT, FORWARDER_SOURCE, GATEWAY_SOCKET, withForwarder } from "../gateway/forwarder.js";
import type { GatewayPass, ModelGateway } from "../gateway/gateway.js";
import { recordedCalls } from "../gateway/recorded-calls.js";
import { spentBudgets } from "../gateway/spent-budgets.js";
import type { Sandbox } from "../sandbox/sandbox.js";
import type { WorkerMetrics } from "../worker-metrics.js";

/** What the attempt's model access needs of its run. */
export interface AttemptModelsContext {
  gateway: Pick<ModelGateway, "open" | "listenUnix" | "publicUrl">;
  topology: Topology;
  jobId: string;
  attempt: number;
  workerId: string;
  traceparent: string | undefined;
  log: Logger;
  metrics: WorkerMetrics | undefined;
  /** The job's record as the attempt last wrote it (its events report it). */
  record(): JobRecord | undefined;
  /** Publishes one event of the attempt on its own, deduplicated by `msgID`. */
  publishApart(event: JobEvent, msgID: string): Promise<void>;
}

/**
 * One attempt's way to its models through the worker's gateway (docs/models.md): the pass and
 * its token, the variables the agent gets (and, in a sandbox with no network, the socket in its
 * workspace and the forwarder beside it), the call-by-call reports, and what the calls used.
 */
export class AttemptModels {
  private pass: GatewayPass | undefined;
  private closeSocket: (() => Promise<void>) | undefined;
  private calls = 0;

  constructor(
    private readonly models: AgentModels,
    private readonly ctx: AttemptModelsContext,
  ) {}

  /** Opens the attempt's pass and gives the agent its variables; the command to run (with the forwarder beside it, where one is needed). */
  async prepare(sandbox: Sandbox, env: Record<string, string>, argv: string[]): Promise<string[]> {
    const { gateway } = this.ctx;
    this.pass = await this.open();
    if (sandbox.kind === "host") {
      Object.assign(env, this.pass.env());
      return argv;
    }
    if (sandbox.kind === "e2b") {
      // Off this machine: the gateway's public address, which its network lets through (checkModels made sure there is one).
      Object.assign(env, this.pass.env(gateway.publicUrl));
      return argv;
    }
    // No network needed: a socket in its bind-mounted workspace, and a forwarder beside it.
    const folder = sandbox.localFolder;
    if (!folder) {
      throw new BoxcarError(
        ErrorCode.noSandbox,
        `the model gateway cannot reach this ${sandbox.kind} sandbox: its workspace is not a folder of this worker's machine`,
      );
    }
    await sandbox.writeFile(FORWARDER_SCRIPT, new TextEncoder().encode(FORWARDER_SOURCE));
    this.closeSocket = await gateway.listenUnix(join(folder, GATEWAY_SOCKET));
    Object.assign(env, this.pass.env(`http://127.0.0.1:${FORWARD_PORT}`));
    return withForwarder(argv, sandbox.workspace);
  }

  /** Opens the attempt's pass for calls made by the worker itself (a prompt agent's loop): the variables, at the gateway's own address. */
  async prepareHere(): Promise<Record<string, string>> {
    this.pass = await this.open();
    return this.pass.env();
  }

  private async open(): Promise<GatewayPass> {
    const { gateway, topology, jobId } = this.ctx;
    return gateway.open({
      jobId,
      attempt: this.ctx.attempt,
      providers: this.models.providers,
      ...(this.ctx.traceparent ? { traceparent: this.ctx.traceparent } : {}),
      ...(this.models.record ? { recorder: recordedCalls(topology, jobId) } : {}),
      ...(await this.fromPolicy()),
      onCall: (call) => void this.report(call),
    });
  }

  /** Ends the pass (its token is refused from now on) and its socket; what the calls used, or undefined for none. */
  async end(): Promise<Usage | undefined> {
    const pass = this.pass;
    if (!pass) return undefined;
    pass.close();
    await this.closeSocket?.().catch((err: unknown) => this.ctx.log.warn({ err }, "could not close the model gateway's socket"));
    return pass.calls > 0 ? pass.usage : undefined;
  }

  /**
   * The system policy's prices, model limits and budgets that stop, read as the agent starts (a
   * policy that cannot be read prices nothing and limits nothing, and says so).
   */
  private async fromPolicy(): Promise<{
    price: (call: ModelCall) => number;
    limiter?: CallLimiter;
    spentBudget?: () => Promise<string | undefined>;
  }> {
    try {
      const found = await getJson(this.ctx.topology.policy, POLICY_KEY, SystemPolicy, "system policy");
      const topology = this.ctx.topology;
      const record = this.ctx.record();
      const policy = found?.value;
      const { prices = {}, modelLimits = [] } = policy ?? {};
      const budgets = policy && record ? spentBudgets(policy, record.agent, ownerOf(record), topology.usageOf) : undefined;
      return {
        price: (call) => priceOf(prices, call),
        ...(modelLimits.length > 0 ? { limiter: kvCallLimiter(() => topology.modelUse(), modelLimits) } : {}),
        ...(budgets ? { spentBudget: budgets } : {}),
      };
    } catch (err) {
      this.ctx.log.warn(
        { err },
        "could not read the system policy's prices and model limits: model calls cost nothing and are not limited",
      );
      return { price: () => 0 };
    }
  }

  /**
   * One call through the gateway, as it ended: a `model_call` event (what was called, its status,
   * tokens and timings; never its text), and a `usage` event the dispatchers sum against budgets
   * as they do an agent's own reports, each stored apart and deduplicated by the call's number.
   */
  private async report(call: ModelCall): Promise<void> {
    const record = this.ctx.record();
    if (!record) return;
    const { jobId, attempt, workerId } = this.ctx;
    const n = ++this.calls;
    this.ctx.metrics?.modelCall(call);
    // A replayed call cost nothing of the provider's this time: it counts as a call, not its tokens.
    const used = {
      calls: 1,
      tokensIn: call.replayed ? 0 : call.tokensIn,
      tokensOut: call.replayed ? 0 : call.tokensOut,
      cost: call.cost ?? 0,
    };
    const usage = call.model ? { ...used, models: { [call.model]: used } } : used;
    const who = { attempt, workerId };
    const how = call.replayed
      ? " (replayed from the job's recording)"
      : call.refused
        ? ` (refused by the gateway: ${call.refused === "budget" ? "a budget that stops is spent" : "the fleet's model limit"})`
        : "";
    const message = `${call.provider} ${call.model ?? "?"} ${call.status}${how}: ${call.tokensIn} tokens in, ${call.tokensOut} out, ${call.latencyMs} ms`;
    try {
      await this.ctx.publishApart({ ...jobEvent(record, "model_call", { call, message }), ...who }, `${jobId}:${attempt}:model_call:${n}`);
      if (call.refused) return; // the provider was not called: nothing used
      await this.ctx.publishApart(
        { ...jobEvent(record, "usage", { usage, usageBy: "gateway", message }), ...who },
        `${jobId}:${attempt}:gateway_usage:${n}`,
      );
    } catch (err) {
      this.ctx.log.warn({ err }, "could not report a model call");
    }
  }
}
