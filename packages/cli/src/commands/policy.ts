import { readFile } from "node:fs/promises";
import { parsePolicyFile } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { json } from "../output.js";
import { UsageError } from "../usage-error.js";

const usage = "boxcar policy show | set -f FILE";

export const policy: Command = {
  name: "policy",
  usage,
  summary: "show or set the system policy: what agents may ask for, and users' quotas",
  maxArgs: 1,
  options: { file: { type: "string", short: "f" } },
  async run(ctx) {
    const [verb] = ctx.positionals;
    switch (verb) {
      case "show": {
        await using session = await ctx.session("boxcar-policy");
        ctx.print(json(await session.client.getPolicy()));
        return ExitCode.ok;
      }
      case "set": {
        const file = ctx.values.file as string | undefined;
        if (!file) throw new UsageError(`policy set needs -f FILE\n\nusage: ${usage}`);
        let text: string;
        try {
          text = await readFile(file, "utf8");
        } catch (err) {
          throw new UsageError(`cannot read policy file ${file}: ${(err as Error).message}`);
        }
        const parsed = parsePolicyFile(text, file); // checked before anything is sent
        await using session = await ctx.session("boxcar-policy");
        const reply = await session.client.setPolicy(parsed);
        if (ctx.values.json) {
          ctx.print(json(reply));
          return ExitCode.ok;
        }
        ctx.print("policy set");
        for (const a of reply.refusedAgents) {
          ctx.print(
            `  agent ${a.name} does not conform (jobs for it are refused): ${a.issues.map((i) => `${i.path}: ${i.message}`).join("; ")}`,
          );
        }
        return ExitCode.ok;
      }
      default:
        throw new UsageError(`${verb ? `unknown policy command ${verb}` : "missing policy command"}\n\nusage: ${usage}`);
    }
  },
};
