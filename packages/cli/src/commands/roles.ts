import { startDispatcher } from "@boxcar/dispatcher";
import { WorkSigner } from "@boxcar/fabric";
import { BoxcarError, ErrorCode, parseDurationMs, WorkerStatus, workerViews } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { connectionFrom, onStop, openRoleSession, systemOptions, systemOptionsFrom, unlessStopped } from "../context.js";
import { ExitCode } from "../exit-codes.js";
import { HealthEndpoint, type RolePhase } from "../health.js";
import { createLogger, type LogFormat } from "../logger.js";
import { MetricsEndpoint } from "../metrics.js";
import { ago, json, table } from "../output.js";
import { listenAddressFrom } from "../role-endpoint.js";
import { startRoleTracing } from "../tracing.js";
import { UsageError } from "../usage-error.js";

export const logFormat = { "log-format": { type: "string" } } as const;

export function readLogFormat(value: unknown): LogFormat | undefined {
  if (value === undefined || value === "json" || value === "pretty") return value;
  throw new UsageError(`--log-format must be json or pretty, got ${String(value)}`);
}

export function positiveInt(value: unknown, flag: string, fallback: number, max = 10_000): number {
  return value === undefined ? fallback : wholeNumber(value, flag, 1, max);
}

/** A flag's whole number from `min` to `max`, or a usage error saying so. */
export function wholeNumber(value: unknown, flag: string, min: number, max: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max)
    throw new UsageError(`${flag} must be a whole number from ${min} to ${max}, got ${String(value)}`);
  return n;
}

export function optionalDuration(value: unknown, flag: string): number | undefined {
  if (value === undefined) return undefined;
  const ms = parseDurationMs(String(value));
  if (ms === undefined) throw new UsageError(`${flag} must be a duration such as 30s or 2m, got ${String(value)}`);
  return ms;
}

export const dispatcher: Command = {
  name: "dispatcher",
  usage:
    "boxcar dispatcher [--health HOST:PORT] [--metrics HOST:PORT] [--replicas 1|3|5] [--stream-limits events=SIZE,logs=SIZE,dead=SIZE] [--log-format json|pretty]",
  summary: "run a dispatcher until SIGINT/SIGTERM",
  maxArgs: 0,
  options: { ...logFormat, ...systemOptions, health: { type: "string" }, metrics: { type: "string" } },
  async run(ctx) {
    const logger = createLogger(readLogFormat(ctx.values["log-format"]));
    const system = systemOptionsFrom(ctx.values, ctx.io.env);
    const healthAddress = listenAddressFrom("health", ctx.values.health, ctx.io.env);
    let phase: RolePhase = "starting";
    // Listening before NATS is reached: a dispatcher waiting for the cluster is alive, not ready.
    await using health = new HealthEndpoint(logger);
    health.report(() => phase);
    if (healthAddress) await health.listen(healthAddress);
    const metricsAddress = listenAddressFrom("metrics", ctx.values.metrics, ctx.io.env);
    await using metrics = await MetricsEndpoint.open(metricsAddress, logger);
    await using _tracing = await startRoleTracing("boxcar-dispatcher", ctx.io.env, logger);
    const { signal } = ctx.io;
    await using session = await unlessStopped(
      signal,
      openRoleSession(connectionFrom(ctx.values, ctx.io.env), ctx.values.prefix, "boxcar-dispatcher", logger, {
        ...system,
        connected: (nc) => health.follow(nc),
        signal,
      }),
      logger,
    );
    if (!session) return ExitCode.ok;
    // With a NATS credential, the dispatcher signs work items with its key (workers check them).
    const signer = session.connection.seed ? new WorkSigner(session.connection.seed) : undefined;
    await using d = await unlessStopped(
      signal,
      startDispatcher({
        topology: session.topology,
        logger,
        signal,
        ...(signer ? { signer } : {}),
        ...(metrics ? { metrics: metrics.registry } : {}),
      }),
      logger,
    );
    if (!d) return ExitCode.ok;
    if (signer) logger.info({ publicKey: signer.publicKey }, "work items are signed");
    phase = "ready";
    await new Promise<void>((r) => onStop(signal, r));
    phase = "draining";
    await d.close();
    phase = "stopped";
    return ExitCode.ok;
  },
};

export const workers: Command = {
  name: "workers",
  usage: "boxcar workers [--status live|draining|gone|stopped]",
  summary: "list workers (live, draining, gone) with their load, and what became of a gone worker's jobs",
  maxArgs: 0,
  options: { status: { type: "string" } },
  async run(ctx) {
    const wanted = ctx.values.status;
    if (wanted !== undefined && !WorkerStatus.safeParse(wanted).success) {
      throw new UsageError(`--status must be live, draining, gone or stopped, got ${String(wanted)}`);
    }
    await using session = await ctx.session("boxcar-workers");
    const { client } = session;
    const all = await workerViews(await client.listWorkers(), async (id) => {
      try {
        return await client.getJob(id);
      } catch (err) {
        if (err instanceof BoxcarError && err.code === ErrorCode.notFound) return undefined;
        throw err;
      }
    });
    const list = wanted === undefined ? all : all.filter((w) => w.status === wanted);
    if (ctx.values.json) {
      ctx.print(json(list));
      return ExitCode.ok;
    }
    ctx.print(
      table(
        ["WORKER", "STATUS", "POOLS", "SANDBOXES", "LOAD", "HEARTBEAT"],
        list.map((w) => [
          w.id,
          w.status,
          w.pools.join(","),
          w.sandboxes.join(",") + (w.warm ? ` (${w.warm} warm)` : ""),
          `${w.load}/${w.capacity}`,
          ago(w.heartbeatAt),
        ]),
      ),
    );
    for (const w of list) {
      if (!w.inFlight?.length) continue;
      ctx.print(
        `\n${w.id} is gone (no heartbeat for ${seconds(w.heartbeatAgeMs)}, bound ${seconds(w.goneAfterMs)}); jobs it had in flight:`,
      );
      for (const job of w.inFlight) ctx.print(`  ${job.jobId}  ${job.summary}`);
    }
    return ExitCode.ok;
  },
};

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(ms < 10_000 ? 1 : 0)}s`;
}
