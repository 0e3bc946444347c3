import { createHash } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { isRevisionConflict, isStorageFull, type Topology } from "@boxcar/fabric";
import { type AgentDefinition, BoxcarError, ErrorCode, type JobSpec, MAX_DELAY_MS } from "@boxcar/protocol";

/** How long a reservation keeps trying when other dispatchers change the limit's state first. */
const RESERVE_WITHIN_MS = 5_000;

type RateLimit = NonNullable<AgentDefinition["rateLimit"]>;

/**
 * A rate-limited job's turn (ms since the epoch), reserved no later than 30 days ahead and before
 * its deadline: a job that could not start in time is refused (`unavailable`), not queued.
 */
export function reserveFor(
  topology: Topology,
  agent: AgentDefinition,
  job: { spec: Pick<JobSpec, "deadline" | "input" | "labels">; owner: string },
  now: number,
): Promise<number> {
  const { deadline } = job.spec;
  const latest = Math.min(now + MAX_DELAY_MS, deadline === undefined ? Number.POSITIVE_INFINITY : now + deadline - 1);
  return reserveStart(topology, limitKey(agent, job), agent.rateLimit as RateLimit, now, latest);
}

/**
 * Reserves a start for a job of `agent` under its rate limit (docs/flow-control.md#rate-limits):
 * the time (ms since the epoch), not before `earliest`, at which it may start. The limit is the
 * generic cell rate algorithm: starts `per / starts` apart, up to `burst` at once after a quiet
 * spell, its one number (when the next start is due, its "theoretical arrival time") kept in the
 * limits bucket under the agent's name and changed by compare-and-swap, so every dispatcher
 * reserves from the same schedule, with no lock. A start later than `latest` is not reserved:
 * `unavailable`, saying when the limit has room (nothing was taken). `earliest` is now for a job
 * that may start now: a delayed job reserves when its time comes, or it would hold up everyone's.
 */
async function reserveStart(topology: Topology, key: string, limit: RateLimit, earliest: number, latest: number): Promise<number> {
  const bucket = await topology.limits();
  const interval = limit.per / limit.starts;
  const tolerance = interval * (limit.burst - 1);
  const giveUpAt = Date.now() + RESERVE_WITHIN_MS;
  for (let tries = 1; ; tries++) {
    const entry = await bucket.get(key);
    const stored = entry && entry.operation === "PUT" ? dueOf(entry.string()) : undefined;
    const tat = Math.max(stored ?? 0, earliest);
    const start = Math.max(earliest, tat - tolerance);
    if (start > latest) {
      throw new BoxcarError(
        ErrorCode.unavailable,
        `the rate limit of ${describeKey(key)} has no start free before ${new Date(latest).toISOString()} (the next is ${new Date(start).toISOString()}): submit again later`,
      );
    }
    const next = JSON.stringify({ due: tat + interval });
    try {
      if (entry && entry.operation === "PUT") await bucket.update(key, next, entry.revision);
      else await bucket.create(key, next);
      return start;
    } catch (err) {
      if (isStorageFull(err)) {
        throw new BoxcarError(ErrorCode.unavailable, `the limits bucket is full (256 MiB of rate limits' states): submit again later`);
      }
      if (!isRevisionConflict(err)) throw err;
    }
    if (Date.now() > giveUpAt) {
      throw new BoxcarError(ErrorCode.unavailable, `too many jobs of ${describeKey(key)} reserved their start at once: submit again`);
    }
    // Another dispatcher got there first: a moment's jittered pause, so that many do not collide again.
    await sleep(Math.random() * Math.min(50, 2 * tries));
  }
}

/**
 * Where the state of the limit a job of `agent` falls under is kept: the agent's name, and with
 * a `key`, a digest of the job's value of it (one limit per value; jobs without one share one).
 */
function limitKey(agent: AgentDefinition, job: { spec: Pick<JobSpec, "input" | "labels">; owner: string }): string {
  const by = agent.rateLimit?.key;
  if (by === undefined) return agent.name;
  const digest = createHash("sha256")
    .update(valueAt(job, by) ?? "\0none")
    .digest("hex");
  return `${agent.name}.${digest.slice(0, 32)}`;
}

/**
 * A job's value of a limit's key, as text: its owner, a field of its input, or one of its
 * labels. Only a string or a number is a value (`1` and `"1"` are one); anything else is none.
 */
function valueAt({ spec, owner }: { spec: Pick<JobSpec, "input" | "labels">; owner: string }, key: string): string | undefined {
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

function describeKey(key: string): string {
  const dot = key.indexOf(".");
  return dot === -1 ? `agent ${key}` : `agent ${key.slice(0, dot)} (for this job's key)`;
}

/** Forgets an agent's rate limits' state (its limit changed, or it is removed): the next job starts afresh. */
export async function forgetLimit(topology: Topology, agent: string): Promise<void> {
  const { names, jsm } = topology;
  await topology.limits();
  // One purge for the agent's own key and every value's: the bucket's stream, filtered.
  for (const filter of [agent, `${agent}.>`]) {
    await jsm.streams.purge(`KV_${names.buckets.limits}`, { filter: `$KV.${names.buckets.limits}.${filter}` });
  }
}

function dueOf(text: string): number | undefined {
  try {
    const due = (JSON.parse(text) as { due?: unknown }).due;
    return typeof due === "number" && Number.isFinite(due) ? due : undefined;
  } catch {
    return undefined;
  }
}
