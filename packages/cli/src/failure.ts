import { BoxcarError, ErrorCode, toErrorInfo } from "@boxcar/protocol";
import { errors as natsErrors } from "@nats-io/transport-node";
import type { Io } from "./context.js";
import { ExitCode } from "./exit-codes.js";
import { UsageError } from "./usage-error.js";

export function exitCodeFor(err: unknown): ExitCode {
  if (err instanceof UsageError) return ExitCode.usage;
  if (err instanceof BoxcarError) {
    if (err.name === "FileError") return ExitCode.usage;
    if (err.code === ErrorCode.unavailable) return ExitCode.unavailable;
    if (err.code === ErrorCode.internal) return ExitCode.internal;
    return ExitCode.refused;
  }
  const code = (err as { code?: unknown })?.code;
  if (code === "ECONNREFUSED" || (err as Error)?.name === "ConnectionError") return ExitCode.unavailable;
  return ExitCode.internal;
}

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

/**
 * Tells the user why command `name` (run as `argv`) failed with `thrown`, on stderr (and as JSON
 * on stdout with `--json`), and returns its exit code.
 */
export function reportFailure(thrown: unknown, name: string, argv: readonly string[], io: Io): ExitCode {
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
