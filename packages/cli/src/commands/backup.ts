import { connectNats } from "@boxcar/client";
import { BackupFileError, backupSystem, restoreSystem, type StreamSummary } from "@boxcar/fabric";
import { BoxcarError, DEFAULT_PREFIX, ErrorCode } from "@boxcar/protocol";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Command, Values } from "../command.js";
import { type CommandContext, connectionFrom } from "../context.js";
import { ExitCode } from "../exit-codes.js";
import { json } from "../output.js";
import { replicasFrom } from "../role-session.js";
import { UsageError } from "../usage-error.js";

const backupUsage = "boxcar backup FILE";
const restoreUsage = "boxcar restore FILE [--replicas 1|3|5]";

export const backup: Command = {
  usage: backupUsage,
  maxArgs: 1,
  options: {},
  async run(ctx) {
    const file = fileArgument(ctx, backupUsage);
    const prefix = ctx.values.prefix ?? DEFAULT_PREFIX;
    return withNats(ctx, "boxcar-backup", async (nc) => {
      const summary = await localFile(
        stopped(
          ctx,
          `backup stopped before it ended: nothing was kept (${file}.partial is removed)`,
          backupSystem(nc, {
            prefix,
            file,
            signal: ctx.io.signal,
            onStream: (s) => {
              if (!ctx.values.json) ctx.print(streamLine(s));
            },
          }),
        ),
      );
      if (ctx.values.json) {
        ctx.print(json(summary));
        return ExitCode.ok;
      }
      ctx.print(
        `backed up ${summary.messages} messages (${size(summary.bytes)}) of ${summary.streams.length} streams of prefix ${prefix} to ${file} ` +
          `(${size(summary.fileBytes)} compressed, mode 0600) in ${seconds(summary.ms)}`,
      );
      return ExitCode.ok;
    });
  },
};

export const restore: Command = {
  usage: restoreUsage,
  maxArgs: 1,
  options: { replicas: { type: "string" } },
  async run(ctx) {
    const file = fileArgument(ctx, restoreUsage);
    const prefix = ctx.values.prefix ?? DEFAULT_PREFIX;
    const replicas = replicasFrom(ctx.values.replicas, ctx.io.env);
    return withNats(ctx, "boxcar-restore", async (nc) => {
      const summary = await localFile(
        restoreSystem(nc, {
          prefix,
          file,
          ...(replicas !== undefined ? { replicas } : {}),
          signal: ctx.io.signal,
          onPlan: (plan) => {
            if (!ctx.values.json)
              ctx.print(
                `${file}: a complete backup of prefix ${prefix} made ${plan.createdAt}, ${plan.streams.length} streams, ${plan.messages} messages`,
              );
          },
          onStream: (s) => {
            if (ctx.values.json) return;
            const filled = s.filled > 0 ? `, ${s.filled} gaps in its sequence kept` : "";
            ctx.print(`${streamLine(s)}  ${s.replicas} replica${s.replicas === 1 ? "" : "s"}${filled}`);
          },
        }),
      );
      if (ctx.values.json) {
        ctx.print(json(summary));
        return ExitCode.ok;
      }
      ctx.print(
        `restored ${summary.messages} messages of ${summary.streams.length} streams in ${seconds(summary.ms)} (${seconds(summary.checkMs)} checking the file); ` +
          "start the dispatchers and workers, with the credentials the backed-up system used",
      );
      return ExitCode.ok;
    });
  },
};

function fileArgument(ctx: CommandContext<Values>, usage: string): string {
  const [file] = ctx.positionals;
  if (!file) throw new UsageError(`missing FILE\n\nusage: ${usage}`);
  return file;
}

/** A backup that SIGINT or SIGTERM cut short: said plainly, without a stack. */
async function stopped<T>(ctx: CommandContext<Values>, message: string, work: Promise<T>): Promise<T> {
  try {
    return await work;
  } catch (err) {
    if (ctx.io.signal.aborted) throw new BoxcarError(ErrorCode.cancelled, message, { cause: err });
    throw err;
  }
}

/** A file that cannot be read or written, or is no backup to restore, is the command line's fault: nothing was made. */
async function localFile<T>(work: Promise<T>): Promise<T> {
  try {
    return await work;
  } catch (err) {
    if (err instanceof BackupFileError) throw new UsageError(err.message);
    throw err;
  }
}

async function withNats(ctx: CommandContext<Values>, name: string, body: (nc: NatsConnection) => Promise<number>): Promise<number> {
  const nc = await connectNats(connectionFrom(ctx.values, ctx.io.env), name);
  try {
    return await body(nc);
  } finally {
    await nc.close().catch(() => {});
  }
}

function streamLine(s: StreamSummary): string {
  return `${s.stream.padEnd(30)} ${String(s.messages).padStart(8)} messages  ${size(s.bytes).padStart(10)}`;
}

function size(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 ** 2) return `${(bytes / 1024).toFixed(1)} KiB`;
  if (bytes < 1024 ** 3) return `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
  return `${(bytes / 1024 ** 3).toFixed(2)} GiB`;
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)}s`;
}
