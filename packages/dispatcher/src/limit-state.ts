import { createHash } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { isRevisionConflict, isStorageFull } from "@boxcar/fabric";
import { BoxcarError, ErrorCode, type JobSpec } from "@boxcar/protocol";
import type { KV } from "@nats-io/kv";

/** How long a change keeps trying when other dispatchers change the same entry first. */
const CHANGE_WITHIN_MS = 5_000;

/** What a limit's key is read from: the job's owner, input and labels. */
export interface KeyedJob {
  spec: Pick<JobSpec, "input" | "labels">;
  owner: string;
}

/**
 * Which value of a limit's key (`owner`, `input.<field>...` or `label.<name>`) a job has, as a
 * digest fit for a KV key or a subject token: one limit per value, and one for all the jobs
 * that have none. Undefined for a limit with no key.
 */
export function valueDigest(key: string | undefined, job: KeyedJob): string | undefined {
  if (key === undefined) return undefined;
  return createHash("sha256")
    .update(valueAt(job, key) ?? "\0none")
    .digest("hex")
    .slice(0, 32);
}

/**
 * A job's value of a limit's key, as text: its owner, a field of its input, or one of its
 * labels. Only a string or a number is a value (`1` and `"1"` are one); anything else is none.
 */
function valueAt({ spec, owner }: KeyedJob, key: string): string | undefined {
  const [where, ...path] = key.split(".");
  let value: unknown;
  if (where === "owner") value = owner;
  else if (where === "label") value = ownField(spec.labels, path.join("."));
  else {
    value = spec.input;
    for (const field of path) value = ownField(value, field);
  }
  return typeof value === "string" || (typeof value === "number" && Number.isFinite(value)) ? String(value) : undefined;
}

/** A plain object's own field (never one it inherits, such as `constructor`). */
function ownField(value: unknown, field: string): unknown {
  return value !== null && typeof value === "object" && !Array.isArray(value) && Object.hasOwn(value, field)
    ? (value as Record<string, unknown>)[field]
    : undefined;
}

/** What one look at a limit's entry decides: what it holds next (nothing to write: leave it), and what the change returns. */
export interface Step<R> {
  write?: string;
  result: R;
}

/**
 * Changes one entry of the limits bucket by compare-and-swap: `step` is shown what it holds
 * (undefined: nothing) and says what it should hold. When another dispatcher changed it first,
 * it is read again after a moment's jittered pause (so that many do not collide again), for up
 * to 5 s; then, or when the bucket is full, `unavailable`. `what` names the limit in that error.
 */
export async function changeEntry<R>(bucket: KV, key: string, what: string, step: (held: string | undefined) => Step<R>): Promise<R> {
  const giveUpAt = Date.now() + CHANGE_WITHIN_MS;
  for (let tries = 1; ; tries++) {
    const entry = await bucket.get(key);
    const live = entry?.operation === "PUT" ? entry : undefined;
    const { write, result } = step(live?.string());
    if (write === undefined) return result;
    try {
      if (live) await bucket.update(key, write, live.revision);
      else await bucket.create(key, write);
      return result;
    } catch (err) {
      if (isStorageFull(err)) {
        throw new BoxcarError(ErrorCode.unavailable, "the limits bucket is full (256 MiB of limits' states): submit again later");
      }
      if (!isRevisionConflict(err)) throw err;
    }
    if (Date.now() > giveUpAt)
      throw new BoxcarError(ErrorCode.unavailable, `too many jobs of ${what} changed its limit at once: submit again`);
    await sleep(Math.random() * Math.min(50, 2 * tries));
  }
}
