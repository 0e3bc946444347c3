import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { ExitCode } from "./exit-codes.js";

/** A wrong command line: unknown command or flag, missing or malformed argument. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

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
