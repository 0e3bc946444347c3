import { z } from "zod";

/** The units a duration may be written in, and their milliseconds: the docs' table of them is made from this. */
export const DURATION_UNIT_MS = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;
const DURATION = new RegExp(`^(\\d+(?:\\.\\d+)?)(${Object.keys(DURATION_UNIT_MS).join("|")})$`);

/** Parses `500ms`, `30s`, `10m`, `2h`, `7d` (or a number of milliseconds) into milliseconds. */
export function parseDurationMs(value: string | number): number | undefined {
  if (typeof value === "number") return Number.isFinite(value) && value >= 0 ? value : undefined;
  const m = DURATION.exec(value.trim());
  if (!m) return undefined;
  return Math.round(Number(m[1]) * DURATION_UNIT_MS[m[2] as keyof typeof DURATION_UNIT_MS]);
}

/** The units a size may be written in, and their bytes: the docs' table of them is made from this. */
export const SIZE_UNIT = { B: 1, K: 1e3, Ki: 1024, M: 1e6, Mi: 1024 ** 2, G: 1e9, Gi: 1024 ** 3 } as const;
const SIZE = new RegExp(`^(\\d+(?:\\.\\d+)?)(${Object.keys(SIZE_UNIT).join("|")})?$`);

/** Parses `512Mi`, `1Gi`, `100M`, `4096` (bytes) into bytes. */
export function parseSizeBytes(value: string | number): number | undefined {
  if (typeof value === "number") return Number.isInteger(value) && value >= 0 ? value : undefined;
  const m = SIZE.exec(value.trim());
  if (!m) return undefined;
  return Math.round(Number(m[1]) * SIZE_UNIT[(m[2] ?? "B") as keyof typeof SIZE_UNIT]);
}

/** A duration written as `30s`/`10m`/… or milliseconds, bounded, read into milliseconds. */
export function durationMs(opts: { min: number; max: number }) {
  return z.union([z.string(), z.number()], { error: 'expected a duration such as "30s", "10m" or "2h"' }).transform((value, ctx) => {
    const ms = parseDurationMs(value);
    if (ms === undefined) {
      ctx.addIssue({ code: "custom", message: `expected a duration such as "30s", "10m" or "2h", got ${JSON.stringify(value)}` });
      return z.NEVER;
    }
    if (ms < opts.min || ms > opts.max) {
      ctx.addIssue({ code: "custom", message: `duration must be between ${opts.min} ms and ${opts.max} ms, got ${ms} ms` });
      return z.NEVER;
    }
    return ms;
  });
}

/** A size written as `512Mi`/`1Gi`/… or bytes, bounded, read into bytes. */
export function sizeBytes(opts: { min: number; max: number }) {
  return z.union([z.string(), z.number()], { error: 'expected a size such as "512Mi" or "1Gi"' }).transform((value, ctx) => {
    const bytes = parseSizeBytes(value);
    if (bytes === undefined) {
      ctx.addIssue({ code: "custom", message: `expected a size such as "512Mi" or "1Gi", got ${JSON.stringify(value)}` });
      return z.NEVER;
    }
    if (bytes < opts.min || bytes > opts.max) {
      ctx.addIssue({ code: "custom", message: `size must be between ${opts.min} and ${opts.max} bytes, got ${bytes}` });
      return z.NEVER;
    }
    return bytes;
  });
}
