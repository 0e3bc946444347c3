import { readFile } from "node:fs/promises";
import { FileError, InputSchema, parseAgentFile, parsePromptFile } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { json, table } from "../output.js";
import { UsageError } from "../usage-error.js";

const usage = "boxcar agent apply -f FILE [FILE...] (an agent's YAML, or a .prompt file) | ls | get NAME | rm NAME";

/** Reads and validates an agent file; errors name the file, line and field. */
export async function readAgentFile(file: string) {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    throw new UsageError(`cannot read agent file ${file}: ${(err as Error).message}`);
  }
  if (!file.endsWith(".prompt")) return parseAgentFile(text, file);
  const { definition, templateLine, input } = parsePromptFile(text, file);
  await checkTemplate(definition.prompt?.template ?? "", file, templateLine);
  if (!input) return definition;
  // Dotprompt's input schema, Picoschema or JSON Schema, as the agent's input schema.
  const fileError = (message: string) =>
    new FileError("prompt file", file, [{ path: "input.schema", message, line: input.line, column: 1 }]);
  const { picoschema } = await import("dotprompt");
  const schema = await picoschema(input.schema).catch((err: unknown) => {
    throw fileError(`not Picoschema or JSON Schema: ${(err as Error).message}`);
  });
  const checked = InputSchema.safeParse(schema);
  if (!checked.success) throw fileError(checked.error.issues[0]?.message ?? "not a JSON Schema");
  return { ...definition, inputSchema: checked.data };
}

/** A prompt's template that is not Handlebars: refused at the file's line, as the frontmatter's errors are. */
async function checkTemplate(template: string, file: string, firstLine: number): Promise<void> {
  // Handlebars and Dotprompt only for a .prompt file: `agent ls` and YAML agents go without.
  const { Dotprompt } = await import("dotprompt");
  try {
    await new Dotprompt().render(template, { input: {} });
  } catch (err) {
    const message = (err as Error).message;
    const line = /line (\d+)/.exec(message)?.[1];
    const at = firstLine + (line ? Number(line) - 1 : 0);
    throw new FileError("prompt file", file, [
      {
        path: "template",
        message: `the template does not parse (Handlebars): ${message.split("\n").filter(Boolean).at(-1) ?? message}`,
        line: at,
        column: 1,
      },
    ]);
  }
}

export const agent: Command = {
  usage,
  maxArgs: Number.POSITIVE_INFINITY,
  options: { file: { type: "string", short: "f", multiple: true, default: [] } },
  async run(ctx) {
    const [verb, ...args] = ctx.positionals;
    const files = ctx.values.file as string[];
    switch (verb) {
      case "apply": {
        // `-f a.yaml b.yaml` as well as `-f a.yaml -f b.yaml`
        const all = [...files, ...args];
        if (files.length === 0) throw new UsageError(`agent apply needs -f FILE\n\nusage: ${usage}`);
        const definitions = await Promise.all(all.map(readAgentFile)); // all files valid before any is applied
        await using session = await ctx.session("boxcar-agent");
        for (const definition of definitions) {
          const { agent, created } = await session.client.applyAgent(definition);
          ctx.print(
            ctx.values.json ? JSON.stringify({ agent: agent.name, created }) : `agent ${agent.name} ${created ? "created" : "updated"}`,
          );
        }
        return ExitCode.ok;
      }
      case "ls": {
        await using session = await ctx.session("boxcar-agent");
        const agents = await session.client.listAgents();
        if (ctx.values.json) ctx.print(json(agents));
        else
          ctx.print(
            table(
              ["NAME", "POOL", "PRIORITY", "SANDBOX", "TIMEOUT", "COMMAND"],
              agents.map((a) => [
                a.name,
                a.pool,
                a.priority ?? "normal",
                a.runtime.sandbox,
                `${a.runtime.timeout / 1000}s`,
                (a.command?.join(" ") ?? `prompt: ${a.prompt?.model}`).replace(/\s+/g, " ").slice(0, 60),
              ]),
            ),
          );
        return ExitCode.ok;
      }
      case "get":
      case "rm": {
        const [name, ...rest] = args;
        if (!name || rest.length > 0) throw new UsageError(`agent ${verb} needs one NAME\n\nusage: ${usage}`);
        await using session = await ctx.session("boxcar-agent");
        if (verb === "get") {
          ctx.print(json(await session.client.getAgent(name)));
        } else {
          await session.client.removeAgent(name);
          ctx.print(ctx.values.json ? JSON.stringify({ removed: name }) : `agent ${name} removed`);
        }
        return ExitCode.ok;
      }
      default:
        throw new UsageError(`${verb ? `unknown agent command ${verb}` : "missing agent command"}\n\nusage: ${usage}`);
    }
  },
};
