import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { shellQuote } from "../shell-word.js";

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** The agent's environment as the file {@link agentCommand} reads: `NAME=value` entries, each ended by a NUL byte. */
export function environmentFile(env: Readonly<Record<string, string>>): Uint8Array {
  let text = "";
  for (const [name, value] of Object.entries(env)) {
    if (!ENV_NAME.test(name)) throw new BoxcarError(ErrorCode.invalid, `${JSON.stringify(name)} is not an environment variable name`);
    if (value.includes("\0")) throw new BoxcarError(ErrorCode.invalid, `the value of ${name} contains a NUL byte`);
    text += `${name}=${value}\0`;
  }
  return new TextEncoder().encode(text);
}

/**
 * The shell command line that runs `argv` in its own process group with exactly the environment
 * in `envFile` (see {@link environmentFile}), removing the file first. The SDK runs commands as
 * `bash -l -c <line>`, whose profile scripts may change the environment (PATH above all), so
 * `env -i` sets the agent's own; `setsid` gives it a process group to be killed with. With
 * `stdinFile`, the command reads that file on its stdin (a session's command). Both files are
 * removed before the agent starts, also when reading them fails (and then it does not start).
 */
export function agentCommand(argv: readonly string[], envFile: string, stdinFile?: string): string {
  const [command] = argv;
  if (command === undefined || command === "") throw new BoxcarError(ErrorCode.invalid, "exec needs a command");
  if (command.startsWith("-") || command.includes("=")) {
    throw new BoxcarError(ErrorCode.invalid, `the command ${JSON.stringify(command)} cannot start with '-' or contain '='`);
  }
  if (argv.some((a) => a.includes("\0"))) throw new BoxcarError(ErrorCode.invalid, "a command argument contains a NUL byte");
  const env = shellQuote(envFile);
  const stdin = stdinFile === undefined ? undefined : shellQuote(stdinFile);
  // Both files are removed whatever happens before the agent starts; it starts only if both were read.
  const open = stdin === undefined ? "" : ` exec 0< ${stdin} || ok=1;`;
  const remove = stdin === undefined ? env : `${env} ${stdin}`;
  return `mapfile -d '' -t BOXCAR_ENV < ${env}; ok=$?;${open} rm -f ${remove}; [ $ok -eq 0 ] && exec setsid env -i "\${BOXCAR_ENV[@]}" ${argv.map(shellQuote).join(" ")}`;
}
