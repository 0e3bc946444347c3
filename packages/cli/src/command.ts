import type { OptionsConfig } from "./command-line.js";
import type { CommandContext } from "./context.js";

export type Values = Record<string, string | boolean | (string | boolean)[] | undefined>;

/**
 * What `boxcar --help` lists of a subcommand, and where its code is: the module is imported only
 * when the command runs (or shows its own help), so that a command loads only what it uses.
 */
export interface CommandEntry {
  name: string;
  summary: string;
  load(): Promise<Command>;
}

/** One `boxcar` subcommand: its flags and what it does. */
export interface Command {
  usage: string;
  options: OptionsConfig;
  /** The most positional arguments the command takes; more is a usage error. */
  maxArgs: number;
  /** Returns the process exit code. */
  run(ctx: CommandContext<Values>): Promise<number>;
}
