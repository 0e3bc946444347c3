import { BoxcarError, ErrorCode, names, toErrorInfo } from "@boxcar/protocol";
import { errors as natsErrors } from "@nats-io/transport-node";
import type { Command, Values } from "./command.js";
import { agent } from "./commands/agent.js";
import { auth } from "./commands/auth.js";
import { backup, restore } from "./commands/backup.js";
import { artifacts, cancel, clean, events, jobs, logs, retry, signal, status, submit } from "./commands/jobs.js";
import { policy } from "./commands/policy.js";
import { dispatcher, workers } from "./commands/roles.js";
import { run } from "./commands/run.js";
import { schedule } from "./commands/schedule.js";
import { session, sessions, snapshots } from "./commands/session.js";
import { ui } from "./commands/ui.js";
import { up } from "./commands/up.js";
import { usage } from "./commands/usage.js";
import { worker } from "./commands/worker.js";
import { workflow } from "./commands/workflow.js";
import { type CommandContext, connectionFrom, type Io, openSession, parseCommandLine } from "./context.js";
import { ExitCode } from "./exit-codes.js";
import { exitCodeFor, UsageError } from "./usage-error.js";

const COMMANDS: readonly Command[] = [
  up,
  dispatcher,
  worker,
  agent,
  submit,
  status,
  logs,
  events,
  artifacts,
  cancel,
  signal,
  retry,
  clean,
  jobs,
  schedule,
  usage,
  run,
  workflow,
  workers,
  policy,
  auth,
  backup,
  restore,
  session,
  sessions,
  snapshots,
  ui,
];

function help(): string {
  const width = Math.max(...COMMANDS.map((c) => c.name.length));
  return [
    "boxcar: run AI agents as durable jobs over NATS",
    "",
    "usage: boxcar COMMAND [flags]",
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

/**
 * NATS refusing a publish or subscription, as a clear `forbidden` error: the credential lacks
 * the permission, most often because `--prefix` or `BOXCAR_IDENTITY` is not the one it was made for.
 */
function refusedByNats(err: unknown): BoxcarError | undefined {
  for (let e = err; e; e = (e as Error).cause) {
    if (e instanceof natsErrors.PermissionViolationError) {
      return new BoxcarError(
        ErrorCode.forbidden,
        `NATS refused to let this credential ${e.operation === "publish" ? "publish to" : "subscribe to"} ${e.subject}: check that --prefix and BOXCAR_IDENTITY (if set) are the ones its credential was made for`,
        { cause: err },
      );
    }
  }
  return undefined;
}

/** Runs one `boxcar` command line and returns its exit code. Never exits the process. */
export async function main(argv: string[], io: Io): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === "--help" || name === "-h" || name === "help") {
    io.stdout.write(`${help()}\n`);
    return name ? ExitCode.ok : ExitCode.usage;
  }
  const command = COMMANDS.find((c) => c.name === name);
  try {
    if (!command) throw new UsageError(`unknown command ${JSON.stringify(name)}\n\n${help()}`);
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
      io.stdout.write(`usage: ${command.usage}\n\n${command.summary}\n\n${EVERY_COMMAND.join("\n")}\n`);
      return ExitCode.ok;
    }
    const ctx: CommandContext<Values> = {
      values: values as CommandContext<Values>["values"],
      positionals,
      io,
      print: (text) => io.stdout.write(`${text}\n`),
      session: (clientName = `boxcar-${name}`) => openSession(connectionFrom(values, io.env), prefix, clientName),
    };
    return await command.run(ctx);
  } catch (thrown) {
    const err = refusedByNats(thrown) ?? thrown;
    const code = exitCodeFor(err);
    const info = toErrorInfo(err);
    if (argv.includes("--json") && !(err instanceof UsageError)) io.stdout.write(`${JSON.stringify({ error: info })}\n`);
    io.stderr.write(`boxcar ${name}: ${err instanceof UsageError ? err.message : `${info.code}: ${info.message}`}\n`);
    for (const issue of code === ExitCode.usage ? [] : (info.issues ?? []))
      io.stderr.write(`  - ${issue.path || "(body)"}: ${issue.message}\n`);
    if (code === ExitCode.internal && err instanceof Error && err.stack) io.stderr.write(`${err.stack}\n`);
    return code;
  }
}
