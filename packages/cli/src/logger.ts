import type { Logger } from "@boxcar/common";
import { pino } from "pino";
import pretty from "pino-pretty";

export type LogFormat = "json" | "pretty";

/**
 * The logger of a long-running role: JSON lines on stderr by default, readable when asked or
 * when stderr is a terminal. Secrets never reach it: roles log ids and codes, not env or input.
 */
export function createLogger(format: LogFormat | undefined, level = process.env.BOXCAR_LOG_LEVEL ?? "info"): Logger {
  const chosen = format ?? (process.stderr.isTTY ? "pretty" : "json");
  if (chosen === "pretty") {
    return pino({ level }, pretty({ destination: 2, colorize: process.stderr.isTTY, ignore: "pid,hostname", sync: true }));
  }
  return pino({ level, base: { pid: process.pid } }, pino.destination({ fd: 2, sync: true }));
}
