import { WorkSigner } from "@boxcar/fabric";
import type { Command } from "../command.js";
import { connectionFrom } from "../context.js";
import { ExitCode } from "../exit-codes.js";
import { logFormat, readLogFormat } from "../flags.js";
import { HealthEndpoint, type RolePhase } from "../health.js";
import { createLogger } from "../logger.js";
import { MetricsEndpoint } from "../metrics.js";
import { listenAddressFrom } from "../role-endpoint.js";
import { onStop, openRoleSession, systemOptions, systemOptionsFrom, unlessStopped } from "../role-session.js";
import { startRoleTracing } from "../tracing.js";

export const dispatcher: Command = {
  usage:
    "boxcar dispatcher [--health HOST:PORT] [--metrics HOST:PORT] [--replicas 1|3|5] [--stream-limits events=SIZE,logs=SIZE,dead=SIZE] [--log-format json|pretty]",
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
    // Loaded here, not with the module: `dispatcher --help` and a bad flag answer without it.
    const { startDispatcher } = await import("@boxcar/dispatcher");
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
