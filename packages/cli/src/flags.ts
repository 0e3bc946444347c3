import { parseDurationMs } from "@boxcar/protocol";
import type { LogFormat } from "./logger.js";
import { UsageError } from "./usage-error.js";

// Flags and checks that several commands share: the roles' (`up`, `dispatcher`, `worker`) and `session`'s.
// Light on purpose: `session` imports it, and must not load a role to check a duration.

/** `--log-format json|pretty`, of the roles. */
export const logFormat = { "log-format": { type: "string" } } as const;

export function readLogFormat(value: unknown): LogFormat | undefined {
  if (value === undefined || value === "json" || value === "pretty") return value;
  throw new UsageError(`--log-format must be json or pretty, got ${String(value)}`);
}

export function positiveInt(value: unknown, flag: string, fallback: number, max = 10_000): number {
  return value === undefined ? fallback : wholeNumber(value, flag, 1, max);
}

/** A flag's whole number from `min` to `max`, or a usage error saying so. */
export function wholeNumber(value: unknown, flag: string, min: number, max: number): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max)
    throw new UsageError(`${flag} must be a whole number from ${min} to ${max}, got ${String(value)}`);
  return n;
}

export function optionalDuration(value: unknown, flag: string): number | undefined {
  if (value === undefined) return undefined;
  const ms = parseDurationMs(String(value));
  if (ms === undefined) throw new UsageError(`${flag} must be a duration such as 30s or 2m, got ${String(value)}`);
  return ms;
}
