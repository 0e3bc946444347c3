import type { Logger } from "@boxcar/common";

/** A logger that keeps each line at info and above as `<level> <message>` in `lines` (its fields go). */
export function noting(lines: string[]): Logger {
  const log: Logger = {
    debug() {},
    info: (_obj, msg) => void lines.push(`info ${msg ?? ""}`),
    warn: (_obj, msg) => void lines.push(`warn ${msg ?? ""}`),
    error: (_obj, msg) => void lines.push(`error ${msg ?? ""}`),
    child: () => log,
  };
  return log;
}
