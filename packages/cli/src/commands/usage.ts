import type { Usage } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { json, table } from "../output.js";
import { UsageError } from "../usage-error.js";

/** `boxcar usage`: a day's usage per agent and per user, as the agents reported it (docs/flow-control.md#usage-and-budgets). */
export const usage: Command = {
  usage: "boxcar usage [--day YYYY-MM-DD]",
  maxArgs: 0,
  options: { day: { type: "string" } },
  async run(ctx) {
    const day = ctx.values.day as string | undefined;
    if (day !== undefined && !/^\d{4}-\d{2}-\d{2}$/.test(day)) throw new UsageError(`--day must be a day as YYYY-MM-DD, got ${day}`);
    await using session = await ctx.session("boxcar-usage");
    const reply = await session.client.getUsage(day);
    if (ctx.values.json) {
      ctx.print(json(reply));
      return ExitCode.ok;
    }
    const rows = (kind: string, of: Record<string, Usage>) =>
      Object.entries(of).map(([name, u]) => [kind, name, String(u.calls), String(u.tokensIn), String(u.tokensOut), String(u.cost)]);
    ctx.print(`usage on ${reply.day} (UTC)`);
    ctx.print(
      table(["OF", "NAME", "CALLS", "TOKENS IN", "TOKENS OUT", "COST"], [...rows("agent", reply.agents), ...rows("user", reply.users)]),
    );
    return ExitCode.ok;
  },
};
