import { readFileSync } from "node:fs";
import { join } from "node:path";
import { names } from "@boxcar/protocol/names";
import { cliPackageDir } from "./cli-package.js";
import type { Values } from "./command.js";
import { parseCommandLine } from "./command-line.js";
import { COMMANDS } from "./command-table.js";
import type { CommandContext, Io } from "./context.js";
import { ExitCode } from "./exit-codes.js";
import { UsageError } from "./usage-error.js";

// Only what every run needs is imported above; a command's module (and what it uses) is imported
// when it runs, the client when it connects, and the error reports when something fails.

function help(): string {
  const width = Math.max(...COMMANDS.map((c) => c.name.length));
  return [
    "boxcar: run AI agents as durable jobs over NATS",
    "",
    "usage: boxcar COMMAND [flags]",
    "       boxcar --version",
    "",
    ...COMMANDS.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`),
    "",
    ...EVERY_COMMAND,
  ].join("\n");
}

/** The flags every command takes, and the exit codes: under `boxcar --help` and each command's own. */
const EVERY_COMMAND = [
  "flags for every command:",
  "  --nats URLS            NATS server, or several comma-separated (default $BOXCAR_NATS_URL, $NATS_URL, then nats://127.0.0.1:4222)",
  "  --creds FILE           NATS credentials file, as `boxcar auth` writes them ($NATS_CREDS)",
  "  --context NAME         use a `nats` CLI context ($NATS_CONTEXT)",
  "  --nkey FILE            nkey seed file ($NATS_NKEY)",
  "  --user U --password P  user and password ($NATS_USER, $NATS_PASSWORD); --token T ($NATS_TOKEN)",
  "  --tls-cert FILE --tls-key FILE --tls-ca FILE [--tls-first]   TLS and mutual TLS ($NATS_CERT, $NATS_KEY, $NATS_CA)",
  "  --prefix P             subject and bucket prefix (default boxcar)",
  "  --json                 machine-readable output",
  "  -h, --help             help for a command",
  "",
  "exit codes: 0 ok, 1 job or run did not succeed, 2 usage, 3 refused, 4 unavailable, 5 internal",
];

/** This CLI's version, from its package.json. */
function version(): string {
  return (JSON.parse(readFileSync(join(cliPackageDir(), "package.json"), "utf8")) as { version: string }).version;
}

/** Runs one `boxcar` command line and returns its exit code. Never exits the process. */
export async function main(argv: string[], io: Io): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === "--help" || name === "-h" || name === "help") {
    io.stdout.write(`${help()}\n`);
    return name ? ExitCode.ok : ExitCode.usage;
  }
  if (name === "--version" && rest.length === 0) {
    io.stdout.write(`boxcar ${version()}\n`);
    return ExitCode.ok;
  }
  const entry = COMMANDS.find((c) => c.name === name);
  try {
    if (!entry) throw new UsageError(`unknown command ${JSON.stringify(name)}\n\n${help()}`);
    const command = await entry.load();
    const { values, positionals } = parseCommandLine(rest, command.options, command.usage);
    const prefix = values.prefix as string | undefined;
    if (prefix !== undefined) {
      try {
        names(prefix);
      } catch (err) {
        throw new UsageError(`--prefix: ${(err as Error).message}`);
      }
    }
    if (positionals.length > command.maxArgs) {
      throw new UsageError(`unexpected argument ${JSON.stringify(positionals[command.maxArgs])}\n\nusage: ${command.usage}`);
    }
    if (values.help) {
      io.stdout.write(`usage: ${command.usage}\n\n${entry.summary}\n\n${EVERY_COMMAND.join("\n")}\n`);
      return ExitCode.ok;
    }
    const ctx: CommandContext<Values> = {
      values: values as CommandContext<Values>["values"],
      positionals,
      io,
      print: (text) => io.stdout.write(`${text}\n`),
      session: async (clientName = `boxcar-${name}`) => {
        const { connectionFrom, openSession } = await import("./context.js");
        return openSession(connectionFrom(values, io.env), prefix, clientName);
      },
    };
    return await command.run(ctx);
  } catch (thrown) {
    const { reportFailure } = await import("./failure.js");
    return reportFailure(thrown, name, argv, io);
  }
}
