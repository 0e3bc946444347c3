import { startDispatcher } from "@boxcar/dispatcher";
import { parseDurationMs } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { createLogger, type LogFormat } from "../logger.js";
import { ago, json, table } from "../output.js";
import { UsageError } from "../usage-error.js";

export const logFormat = { "log-format": { type: "string" } } as const;

export function readLogFormat(value: unknown): LogFormat | undefined {
  if (value === undefined || value === "json" || value === "pretty") return value;
  throw new UsageError(`--log-format must be json or pretty, got ${String(value)}`);
}

export function positiveInt(value: unknown, flag: string, fallback: number, max = 10_000): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1 || n > max)
    throw new UsageError(`${flag} must be a whole number from 1 to ${max}, got ${String(value)}`);
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
  usage: "boxcar dispatcher [--log-format json|pretty]",
  summary: "run a dispatcher until SIGINT/SIGTERM",
  maxArgs: 0,
  options: { ...logFormat },
  async run(ctx) {
    const logger = createLogger(readLogFormat(ctx.values["log-format"]));
    await using session = await ctx.session("boxcar-dispatcher", { create: true });
    await using d = await startDispatcher({ topology: session.topology, logger });
    await new Promise((r) => ctx.io.signal.addEventListener("abort", r, { once: true }));
    await d.close();
    return ExitCode.ok;
  },
};

export const workers: Command = {
  name: "workers",
  usage: "boxcar workers",
  summary: "list live workers with their pools, sandboxes and load",
  maxArgs: 0,
  options: {},
  async run(ctx) {
    await using session = await ctx.session("boxcar-workers");
    const list = await session.client.listWorkers();
    if (ctx.values.json) ctx.print(json(list));
    else
      ctx.print(
        table(
          ["WORKER", "STATE", "POOLS", "SANDBOXES", "LOAD", "HEARTBEAT"],
          list.map((w) => [w.id, w.state, w.pools.join(","), w.sandboxes.join(","), `${w.load}/${w.capacity}`, ago(w.heartbeatAt)]),
        ),
      );
    return ExitCode.ok;
  },
};
