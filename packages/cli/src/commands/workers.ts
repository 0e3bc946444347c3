import { BoxcarError, ErrorCode, WorkerStatus, workerViews } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { ago, json, table } from "../output.js";
import { UsageError } from "../usage-error.js";

export const workers: Command = {
  usage: "boxcar workers [--status live|draining|gone|stopped]",
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
