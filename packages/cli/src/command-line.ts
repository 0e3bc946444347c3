import { type ParseArgsConfig, parseArgs } from "node:util";
import { UsageError } from "./usage-error.js";

// Parsing a command line needs nothing but node:util: every run loads it, before any command's module.

export type OptionsConfig = NonNullable<ParseArgsConfig["options"]>;

/** Flags every command takes. */
export const globalOptions = {
  nats: { type: "string" },
  context: { type: "string" },
  creds: { type: "string" },
  nkey: { type: "string" },
  user: { type: "string" },
  password: { type: "string" },
  token: { type: "string" },
  "tls-cert": { type: "string" },
  "tls-key": { type: "string" },
  "tls-ca": { type: "string" },
  "tls-first": { type: "boolean" },
  prefix: { type: "string" },
  json: { type: "boolean", default: false },
  help: { type: "boolean", short: "h", default: false },
} as const satisfies ParseArgsConfig["options"];

export interface CommandLine {
  values: Record<string, string | boolean | (string | boolean)[] | undefined>;
  positionals: string[];
}

export function parseCommandLine(args: string[], options: OptionsConfig, usage: string): CommandLine {
  const all = { ...globalOptions, ...options };
  try {
    return parseArgs({ args: joinNegativeValues(args, all), options: all, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n\nusage: ${usage}`);
  }
}

/**
 * `args` with a negative number given to a value-taking long option (`--delay -5s`) joined to it
 * (`--delay=-5s`): the parser would take it for a flag, and say its option is missing a value,
 * where the value itself is what is wrong (and gets its own clear error).
 */
function joinNegativeValues(args: readonly string[], options: OptionsConfig): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] as string;
    const next = args[i + 1];
    const name = arg.startsWith("--") && !arg.includes("=") ? arg.slice(2) : undefined;
    if (name !== undefined && options[name]?.type === "string" && next !== undefined && /^-\d/.test(next)) {
      out.push(`${arg}=${next}`);
      i++;
    } else out.push(arg);
  }
  return out;
}
