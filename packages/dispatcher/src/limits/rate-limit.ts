import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { type AgentDefinition, BoxcarError, ErrorCode, type JobRecord, ownerOf } from "@boxcar/protocol";
import { MAX_DELAY_MS } from "@boxcar/protocol/internal";
import type { AgentCatalog } from "../catalog/agent-catalog.js";
import { type KeyedJob, type LimitEntries, valueDigest } from "./limit-state.js";
import { SeenOnce } from "./seen-once.js";

type RateLimit = NonNullable<AgentDefinition["rateLimit"]>;

/**
 * A rate-limited job's turn (ms since the epoch), reserved no later than 30 days ahead and before
 * its deadline: a job that could not start in time is refused (`unavailable`), not queued.
 */
export function reserveFor(
  entries: LimitEntries,
  agent: AgentDefinition,
  job: KeyedJob,
  now: number,
  /** When the job's deadline passes (ms since the epoch), if it has one. */
  deadlineAt?: number,
): Promise<number> {
  const latest = Math.min(now + MAX_DELAY_MS, deadlineAt === undefined ? Number.POSITIVE_INFINITY : deadlineAt - 1);
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
    const { due, pausedUntil } = stateOf(held);
    // Not before the end of a pause its agent's provider asked for.
    const from = Math.max(earliest, pausedUntil ?? 0);
    const tat = Math.max(due ?? 0, from);
    const start = Math.max(from, tat - tolerance);
    if (start > latest) {
      throw new BoxcarError(
        ErrorCode.unavailable,
        `the rate limit of ${describeKey(key)} has no start free before ${new Date(latest).toISOString()} (the next is ${new Date(start).toISOString()}): submit again later`,
      );
    }
    // A pause still ahead is kept (the entry holds both).
    const pause = pausedUntil !== undefined && pausedUntil > earliest ? { pausedUntil } : {};
    return { write: JSON.stringify({ due: tat + interval, ...pause }), result: start };
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

/**
 * A rate limit's state: when its next start is due (the algorithm's one number), and until when
 * it pauses for its provider (an agent's report of a 429), if it does.
 */
interface LimitState {
  due?: number;
  pausedUntil?: number;
}

function stateOf(text: string | undefined): LimitState {
  if (text === undefined) return {};
  try {
    const { due, pausedUntil } = JSON.parse(text) as Record<string, unknown>;
    const time = (value: unknown) => (typeof value === "number" && Number.isFinite(value) ? value : undefined);
    return { due: time(due), pausedUntil: time(pausedUntil) };
  } catch {
    return {};
  }
}

/**
 * Pauses the rate limit a job of `agent` falls under until `until` (ms since the epoch): its agent
 * reported that its provider refused it for its rate limit, and asked it to wait. No start is
 * reserved before then; a pause already longer stays.
 */
export function pauseLimit(entries: LimitEntries, agent: AgentDefinition, job: KeyedJob, until: number): Promise<void> {
  const key = limitKey(agent, job);
  return entries.change(key, describeKey(key), (held) => {
    const state = stateOf(held);
    if ((state.pausedUntil ?? 0) >= until) return { result: undefined };
    return { write: JSON.stringify({ ...state, pausedUntil: until }), result: undefined };
  });
}

/** Until when (ms since the epoch) the rate limit a job of `agent` falls under pauses for its provider, if it does now. */
export async function pausedUntil(entries: LimitEntries, agent: AgentDefinition, job: KeyedJob): Promise<number | undefined> {
  const until = stateOf(await entries.read(limitKey(agent, job))).pausedUntil;
  return until !== undefined && until > Date.now() ? until : undefined;
}

/**
 * Pauses rate limits when their agents report their provider's rate limit (a 429): shown each
 * job record by the dispatcher's watch, a record whose last attempt set `providerLimitedUntil`
 * to a time still ahead pauses the limit its job falls under until then. Every dispatcher sees
 * it; the first to write the pause makes the others' a no-op, and a record replayed at a
 * dispatcher's start pauses nothing that is not still paused.
 */
export class ProviderPauses {
  private readonly applied = new SeenOnce();

  constructor(
    private readonly entries: LimitEntries,
    private readonly agents: Pick<AgentCatalog, "get">,
    private readonly log: Logger,
  ) {}

  readonly observe = (_key: string, job: JobRecord | undefined): void => {
    if (!job?.providerLimitedUntil || !job.spec) return;
    const until = Date.parse(job.providerLimitedUntil);
    const report = `${job.id}@${job.providerLimitedUntil}`;
    if (until <= Date.now() || !this.applied.first(report)) return;
    const keyed = { spec: job.spec, owner: ownerOf(job) };
    void (async () => {
      const agent = await this.agents.get(job.agent);
      if (agent.rateLimit) await pauseLimit(this.entries, agent, keyed, until);
    })().catch((err: unknown) => {
      // Tried again when the record is next seen (another dispatcher may have written it meanwhile).
      this.applied.forget(report);
      this.log.warn({ err, jobId: job.id }, "could not pause a rate limit its agent's provider asked to pause");
    });
  };
}
