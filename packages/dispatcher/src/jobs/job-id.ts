import { randomBytes } from "node:crypto";

/**
 * A job id: 9 base-36 characters of creation time (milliseconds) then 10 random ones, so ids
 * sort by creation time as strings and are safe as NATS subject tokens and KV keys.
 */
export function newJobId(now = Date.now()): string {
  const time = now.toString(36).padStart(9, "0");
  const random = [...randomBytes(10)].map((b) => (b % 36).toString(36)).join("");
  return `${time}${random}`;
}
