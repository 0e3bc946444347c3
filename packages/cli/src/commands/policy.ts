import { readFile } from "node:fs/promises";
import { parsePolicyFile, type SystemPolicy } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { json } from "../output.js";
import { UsageError } from "../usage-error.js";

const usage = "boxcar policy show | set -f FILE [--merge]";

export const policy: Command = {
  usage,
  maxArgs: 1,
  options: { file: { type: "string", short: "f" }, merge: { type: "boolean", default: false } },
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
        const current = await session.client.getPolicy();
        // --merge: the file's settings over the current policy's; else the file is the whole policy.
        const next = ctx.values.merge ? (merged(current, parsed) as SystemPolicy) : parsed;
        const reply = await session.client.setPolicy(next);
        const dropped = settingsOf(current).filter(([path]) => !settingsOf(reply.policy).some(([kept]) => kept === path));
        if (ctx.values.json) {
          ctx.print(json({ ...reply, dropped: dropped.map(([path]) => path) }));
          return ExitCode.ok;
        }
        ctx.print("policy set");
        for (const [path, value] of dropped) {
          ctx.print(
            `  dropped ${path} (was ${JSON.stringify(value)}): the file does not set it; policy set --merge keeps what a file leaves out`,
          );
        }
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

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
const isObject = (v: unknown): v is Record<string, Json> => v !== null && typeof v === "object" && !Array.isArray(v);

/** `over` laid on `base`: objects merged key by key, anything else (a list, a number) replaced whole. */
function merged(base: unknown, over: unknown): unknown {
  if (!isObject(base) || !isObject(over)) return over;
  const out: Record<string, unknown> = { ...base };
  for (const [key, value] of Object.entries(over)) out[key] = merged(base[key], value);
  return out;
}

/** Every setting of a policy, as its dotted path and value (a list is one setting). */
function settingsOf(policy: unknown, at = ""): [string, unknown][] {
  if (!isObject(policy)) return at === "" ? [] : [[at, policy]];
  return Object.entries(policy).flatMap(([key, value]) => settingsOf(value, at ? `${at}.${key}` : key));
}
