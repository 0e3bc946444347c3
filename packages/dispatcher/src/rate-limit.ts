import type { Topology } from "@boxcar/fabric";
import { type AgentDefinition, BoxcarError, ErrorCode, type JobSpec, MAX_DELAY_MS } from "@boxcar/protocol";
import { type KeyedJob, type LimitEntries, valueDigest } from "./limit-state.js";

type RateLimit = NonNullable<AgentDefinition["rateLimit"]>;

/**
 * A rate-limited job's turn (ms since the epoch), reserved no later than 30 days ahead and before
 * its deadline: a job that could not start in time is refused (`unavailable`), not queued.
 */
export function reserveFor(
  entries: LimitEntries,
  agent: AgentDefinition,
  job: { spec: Pick<JobSpec, "deadline" | "input" | "labels">; owner: string },
  now: number,
): Promise<number> {
  const { deadline } = job.spec;
  const latest = Math.min(now + MAX_DELAY_MS, deadline === undefined ? Number.POSITIVE_INFINITY : now + deadline - 1);
  return reserveStart(entries, limitKey(agent, job), agent.rateLimit as RateLimit, now, latest);
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
async function reserveStart(entries: LimitEntries, key: string, limit: RateLimit, earliest: number, latest: number): Promise<number> {
  const interval = limit.per / limit.starts;
  const tolerance = interval * (limit.burst - 1);
  return entries.change(key, describeKey(key), (held) => {
    const tat = Math.max((held === undefined ? undefined : dueOf(held)) ?? 0, earliest);
    const start = Math.max(earliest, tat - tolerance);
    if (start > latest) {
      throw new BoxcarError(
        ErrorCode.unavailable,
        `the rate limit of ${describeKey(key)} has no start free before ${new Date(latest).toISOString()} (the next is ${new Date(start).toISOString()}): submit again later`,
      );
    }
    return { write: JSON.stringify({ due: tat + interval }), result: start };
  });
}

/**
 * Where the state of the limit a job of `agent` falls under is kept: the agent's name, and with
 * a `key`, a digest of the job's value of it (one limit per value; jobs without one share one).
 */
function limitKey(agent: AgentDefinition, job: KeyedJob): string {
  const value = valueDigest(agent.rateLimit?.key, job);
  return value === undefined ? agent.name : `${agent.name}.${value}`;
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
