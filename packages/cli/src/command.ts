import type { CommandContext, OptionsConfig } from "./context.js";

export type Values = Record<string, string | boolean | (string | boolean)[] | undefined>;

/** One `boxcar` subcommand. */
export interface Command {
  name: string;
  usage: string;
  summary: string;
  options: OptionsConfig;
  /** The most positional arguments the command takes; more is a usage error. */
  maxArgs: number;
  /** Returns the process exit code. */
  run(ctx: CommandContext<Values>): Promise<number>;
}
