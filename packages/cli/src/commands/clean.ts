import { isTerminal, JobState, parseDurationMs } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { json } from "../output.js";
import { UsageError } from "../usage-error.js";

/** How many kept jobs `boxcar clean` names, each with why. */
const MAX_KEPT_SHOWN = 20;

export const clean: Command = {
  usage: "boxcar clean --older-than DURATION [--state STATE] [--agent AGENT]",
  maxArgs: 0,
  options: { "older-than": { type: "string" }, state: { type: "string" }, agent: { type: "string" } },
  async run(ctx) {
    const olderThan = ctx.values["older-than"] as string | undefined;
    if (olderThan === undefined) throw new UsageError(`give --older-than, e.g. 1h or 0s for every ended job\n\nusage: ${this.usage}`);
    if (parseDurationMs(olderThan) === undefined)
      throw new UsageError(`--older-than must be a duration such as 30m, 1h or 7d, got ${olderThan}`);
    const state = ctx.values.state as string | undefined;
    const ended = JobState.options.filter((s) => isTerminal(s));
    if (state !== undefined && !(ended as string[]).includes(state)) {
      throw new UsageError(`--state must be a final state (${ended.join(", ")}), got ${state}`);
    }
    await using session = await ctx.session("boxcar-clean");
    let deleted = 0;
    /** Each job kept, by id: a job kept by one request comes back in the next, and its last reason stands. */
    const kept = new Map<string, { id: string; reason: string; message: string }>();
    for (let more = true; more; ) {
      const reply = await session.client.cleanJobs({
        olderThan,
        ...(state ? { state: state as JobState } : {}),
        ...(ctx.values.agent ? { agent: ctx.values.agent as string } : {}),
      });
      deleted += reply.deleted;
      for (const job of reply.keptJobs ?? []) kept.set(job.id, job);
      // Ask again only while a request still deletes some: kept ones would be asked about forever.
      more = reply.more && reply.deleted > 0;
    }
    if (ctx.values.json) ctx.print(json({ deleted, kept: kept.size, keptJobs: [...kept.values()] }));
    else {
      ctx.print(`deleted ${deleted} ended jobs${kept.size > 0 ? `; ${kept.size} kept:` : ""}`);
      const shown = [...kept.values()].slice(0, MAX_KEPT_SHOWN);
      for (const job of shown) ctx.print(`  ${job.id}: ${job.message}`);
      if (kept.size > shown.length) ctx.print(`  ... and ${kept.size - shown.length} more (--json lists them all)`);
    }
    return ExitCode.ok;
  },
};
