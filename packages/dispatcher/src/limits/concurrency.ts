import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { type JobHandle, nowIso, storedMessages } from "@boxcar/fabric/internal";
import {
  type AgentDefinition,
  BoxcarError,
  ErrorCode,
  isTerminal,
  type JobRecord,
  ownerOf,
  type SystemPolicy,
  toErrorInfo,
} from "@boxcar/protocol";
import { JobTransitions, POOL_PLACE_PREFIX, placesOf, TOTAL_PLACE } from "@boxcar/protocol/internal";
import type { AgentCatalog } from "../catalog/agent-catalog.js";
import { cancelJob } from "../jobs/jobs.js";
import { publishWorkItem, type WorkPublishing } from "../jobs/work-items.js";
import { PassPerKey } from "../loops/pass-per-key.js";
import { Sweep } from "../loops/sweep.js";
import { type KeyedJob, LimitEntries, valueDigest } from "./limit-state.js";
import { SeenOnce } from "./seen-once.js";

/** A job's places under concurrency limits, as its record keeps them. */
export type Place = NonNullable<JobRecord["concurrency"]>;

/** A job's places as it entered its limits: its record's `concurrency`, and the places this entry took (not those it held already). */
export interface Entered {
  concurrency: Place;
  taken: string[];
}

/**
 * One limit's state (one agent's, or one value's of its key): the jobs holding its places (since
 * when, ms since the epoch), and its queue, the markers of the jobs waiting for a place, by
 * their work-stream sequence: the last one given a place or passed over (`cursor`), and the last
 * one known to wait (`tail`). A place is free to a new job only when nobody waits.
 */
interface Places {
  holding: Record<string, number>;
  cursor: number;
  tail: number;
}

/** How long a place may be held by a job with no record (its admission died before it) before it is freed. */
const GRACE_MS = 60_000;
/** The entries of concurrency limits in the limits bucket: `=` is in no agent's name, so no rate limit's key starts so. */
const ENTRY_PREFIX = "=places.";

/**
 * Concurrency limits (docs/flow-control.md#concurrency-limits): an agent's `concurrency` lets
 * at most `limit` of its jobs (or of each value of its `key`, and `total` over all values) hold
 * a place at once, and the system policy's `pools.<pool>.concurrency` at most so many of a pool's
 * jobs, from when one is let go to the workers until it ends, across every dispatcher and worker,
 * with no lock.
 *
 * Each limit's state is one entry of the limits bucket, changed by compare-and-swap. A job takes
 * a place under each of its limits in one order (its key's, its agent's total, its pool's), so
 * that no two jobs wait for each other's. A job that finds a free place takes it (one write, the
 * entry's revision remembered) and goes on to the next; one that finds none waits there as a
 * marker, `<prefix>.work.~held.<place>.<jobId>`, in the work stream, which no consumer takes,
 * holding the places before. Holding them all, it is published as any job. When a job ends, the
 * dispatchers (each sees every record) free its places and give each to its oldest marker's job,
 * which goes on to its next limit. A sweep frees what an end seen by no dispatcher left held, and
 * finishes what a dispatcher that died half-way left undone.
 */
export class ConcurrencyLimits {
  private readonly sweeps: Sweep;
  /** Gives a place's free places to its waiting jobs, one pass at a time per place. */
  private readonly promotions: PassPerKey;
  /** The ends this dispatcher freed a place for: a record seen twice frees once. */
  private readonly freed = new SeenOnce();
  private live = false;
  private readonly publishing: WorkPublishing;
  /** The limits bucket's entries, as this dispatcher changes them (rate limits' too). */
  readonly entries: LimitEntries;

  constructor(
    private readonly topology: Topology,
    private readonly agents: Pick<AgentCatalog, "get">,
    private readonly policy: () => SystemPolicy,
    publishing: Omit<WorkPublishing, "limits">,
    private readonly log: Logger,
    intervalMs: number,
  ) {
    this.publishing = { ...publishing, limits: this };
    this.entries = new LimitEntries(() => topology.limits());
    this.promotions = new PassPerKey(
      (place) => this.promote(place),
      (err, place) => log.warn({ err, place }, "could not give a concurrency place to a waiting job; the sweep will"),
    );
    this.sweeps = new Sweep({
      pass: () => this.sweep(),
      intervalMs,
      onError: (err) => log.warn({ err }, "could not sweep the concurrency limits"),
    });
  }

  start(): void {
    this.sweeps.start();
  }

  /**
   * The places a new job of `agent` in `pool` needs (none: undefined), taken in order while they
   * are free and nobody waits for them; at the first that is not, it waits. `drop-new` refuses
   * the job instead (`conflict`) when its agent's limit has no place, and lets go what it took;
   * so does any failure half-way (a limit too busy, say).
   */
  async enter(agent: AgentDefinition, job: KeyedJob & { id: string }, pool: string): Promise<Entered | undefined> {
    const places = this.placesFor(agent, job, pool);
    const last = places.at(-1);
    if (last === undefined) return undefined;
    const chain = places.length > 1 ? { places } : {};
    const taken: string[] = [];
    try {
      for (const [i, place] of places.entries()) {
        const outcome = await this.take(place, job.id, this.limitIn(place, agent));
        if (outcome === "taken") taken.push(place);
        if (outcome) continue;
        if (agent.concurrency?.strategy === "drop-new" && !place.startsWith(POOL_PLACE_PREFIX)) {
          const limit = agent.concurrency;
          const most =
            i === 0 ? `${limit.limit} jobs at once${limit.key ? ` for each ${limit.key}` : ""}` : `${limit.total} jobs at once in all`;
          throw new BoxcarError(
            ErrorCode.conflict,
            `agent ${agent.name} runs at most ${most} and has no place free; its concurrency strategy drops new jobs: submit again later`,
          );
        }
        return { concurrency: { place, ...chain, waiting: true }, taken };
      }
    } catch (err) {
      await this.leave(taken, job.id).catch((freeErr: unknown) =>
        this.log.warn({ err: freeErr, jobId: job.id }, "could not let go of the places taken for a refused job; the sweep will"),
      );
      throw err;
    }
    return { concurrency: { place: last, ...chain }, taken };
  }

  /** The limits a job of `agent` in `pool` takes a place under, in the order it takes them. */
  private placesFor(agent: AgentDefinition, job: KeyedJob, pool: string): string[] {
    const places: string[] = [];
    const limit = agent.concurrency;
    if (limit) places.push(`${agent.name}.${valueDigest(limit.key, job) ?? "all"}`);
    if (limit?.key !== undefined && limit.total !== undefined) places.push(`${agent.name}.${TOTAL_PLACE}`);
    if (this.policy().pools[pool]?.concurrency !== undefined) places.push(POOL_PLACE_PREFIX + pool);
    return places;
  }

  /** How many may hold a place under `place` now, by `agent`'s definition (or the policy's, for a pool); no limit: Infinity. */
  private limitIn(place: string, agent: AgentDefinition | undefined): number {
    const most = place.startsWith(POOL_PLACE_PREFIX)
      ? this.policy().pools[place.slice(POOL_PLACE_PREFIX.length)]?.concurrency
      : place.endsWith(`.${TOTAL_PLACE}`)
        ? agent?.concurrency?.total
        : agent?.concurrency?.limit;
    return most ?? Number.POSITIVE_INFINITY;
  }

  /** How many may hold a place under `place` now, by the applied agent's definition or the policy. */
  private async limitOf(place: string): Promise<number> {
    return this.limitIn(place, place.startsWith(POOL_PLACE_PREFIX) ? undefined : await this.agentOf(agentName(place)));
  }

  /** Takes a place under `place` for `jobId` when one is free and nobody waits for one (`taken`), or says it holds one already (`held`). */
  private take(place: string, jobId: string, limit: number): Promise<"taken" | "held" | false> {
    return this.change(place, (places): "taken" | "held" | false => {
      if (places.holding[jobId] !== undefined) return "held";
      if (count(places) >= limit || places.cursor < places.tail) return false;
      places.holding[jobId] = Date.now();
      return "taken";
    });
  }

  /**
   * Stores the marker a job waiting for a place waits as (deduplicated by `msgID`), notes it in
   * its limit's queue, and gives it a place if one is free by then. Under `cancel-in-progress`,
   * the jobs older than the newest `limit` under its agent's limit are cancelled first, running
   * or waiting.
   */
  async wait(record: JobRecord, agent: AgentDefinition, msgID: string): Promise<void> {
    const concurrency = record.concurrency;
    if (concurrency === undefined) throw new BoxcarError(ErrorCode.internal, `job ${record.id} has no concurrency place`);
    const { place } = concurrency;
    const { js, names } = this.topology;
    const stored = await js.publish(names.subjects.heldWork(place, record.id), JSON.stringify({ jobId: record.id }), { msgID });
    await this.change(place, (places) => {
      if (places.tail >= stored.seq) return false;
      places.tail = stored.seq;
      return true;
    });
    // The strategy cancels under its agent's own limit only (its key's, as the agent is now), once.
    if (agent.concurrency?.strategy === "cancel-in-progress" && !stored.duplicate && this.isKeyPlace(place, agent, record)) {
      await this.cancelOlder(place, agent.concurrency.limit);
    }
    this.kick(place);
  }

  /** Whether `place` is the limit of `record`'s key under `agent` as it is now (the first of its places, never a pool's). */
  private isKeyPlace(place: string, agent: AgentDefinition, record: JobRecord): boolean {
    if (place.startsWith(POOL_PLACE_PREFIX)) return false;
    const keyed = { spec: record.spec ?? { input: null, labels: {} }, owner: ownerOf(record) };
    return place === this.placesFor(agent, keyed, record.pool)[0];
  }

  /** Shown each job record by the dispatcher's watch: a job that held a place and ended frees it. */
  readonly observe = (_key: string, job: JobRecord | undefined): void => {
    if (!this.live || !job?.concurrency || !isTerminal(job.state)) return;
    const held = heldBy(job.concurrency);
    if (held.length === 0) return;
    // Once per end (a job retried by `boxcar retry` ends again, later).
    const end = `${job.id}@${job.finishedAt}`;
    if (!this.freed.first(end)) return;
    void this.leave(held, job.id).catch((err: unknown) =>
      this.log.warn({ err, jobId: job.id }, "could not free an ended job's concurrency places; the sweep will"),
    );
  };

  /** Frees the places `jobId` holds among `places` (one it was given as it ended included). */
  async leave(places: readonly string[], jobId: string): Promise<void> {
    await Promise.all(places.map((place) => this.free(place, jobId)));
  }

  /** From now on, ends the watch shows are new (before, it replays records the sweep deals with). */
  followEnds(): void {
    this.live = true;
  }

  /**
   * Frees the place `jobId` holds, if it holds one, and gives what is free to the jobs waiting,
   * if any wait. The dispatcher that freed it does (a job about to wait whose marker is not yet
   * noted looks for a free place itself once it is: one of the two sees the other; a dispatcher
   * that dies in between leaves it to the sweep).
   */
  async free(place: string, jobId: string): Promise<void> {
    const waiting = await this.change(place, (places): "waiting" | "none" | false => {
      if (places.holding[jobId] === undefined) return false;
      delete places.holding[jobId];
      return places.tail > places.cursor ? "waiting" : "none";
    });
    if (waiting === "waiting") this.kick(place);
  }

  private kick(place: string): void {
    void this.promotions.run(place);
  }

  /** Gives free places to the oldest waiting jobs, passing over the markers of jobs that ended while they waited. */
  private async promote(place: string): Promise<void> {
    const limit = await this.limitOf(place);
    while (!this.sweeps.stopped) {
      const places = parsePlaces((await this.entry(place))?.string());
      if (count(places) >= limit) return;
      const marker = await this.nextMarker(place, places.cursor + 1);
      if (!marker) {
        // Nobody waits: the markers noted when it was read (up to its tail) are gone, given a
        // place or removed with their ended jobs, and are passed over. Not those noted since:
        // they were stored after the look.
        if (places.tail > places.cursor) {
          await this.change(place, (p) => {
            if (p.cursor >= places.tail) return false;
            p.cursor = places.tail;
            return true;
          });
        }
        return;
      }
      const found = marker.jobId === undefined ? undefined : await this.topology.jobStore.read(marker.jobId);
      const waits =
        found?.record.concurrency?.waiting === true && found.record.concurrency.place === place && !isTerminal(found.record.state);
      const outcome = await this.change(place, (p): "taken" | "passed" | false => {
        if (p.cursor >= marker.seq || (waits && count(p) >= limit)) return false;
        p.cursor = marker.seq;
        p.tail = Math.max(p.tail, marker.seq);
        if (!waits || !found) return "passed";
        p.holding[found.record.id] = Date.now();
        return "taken";
      });
      if (outcome === "taken" && found) await this.placed(found, place);
      if (outcome) await this.removeMarker(marker.seq);
    }
  }

  /**
   * A job given a place under `place`: it goes on to its next limit (takes a place there, or waits
   * there), and given its last, its record stops waiting, then its work item goes to its pool. An
   * agent removed while it waited fails it (`unknown_agent`) and frees its places; so does a job
   * that ended meanwhile.
   */
  private async placed(found: JobHandle, place: string): Promise<void> {
    const { topology } = this;
    const record = found.record;
    const jobId = record.id;
    const places = record.concurrency ? placesOf(record.concurrency) : [place];
    const agent = await this.agentOf(record.agent);
    if (!agent) return this.agentRemoved(found, places);
    for (const next of places.slice(places.indexOf(place) + 1)) {
      if (await this.take(next, jobId, await this.limitOf(next))) continue;
      const moved = await topology.jobStore.change(found, (job) => JobTransitions.waitFor(job, place, next));
      if (moved.written) await this.wait(moved.handle.record, agent, `${jobId}:${next}:${record.attempt}`);
      else if (!moved.current || isTerminal(moved.current.record.state)) await this.leave(places, jobId);
      return;
    }
    const given = await topology.jobStore.change(found, JobTransitions.givePlace);
    if (!given.written) {
      if (!given.current || isTerminal(given.current.record.state)) await this.leave(places, jobId);
      return;
    }
    const released = given.handle.record;
    // A job given a place again after `boxcar retry` is on a later attempt: its item is not a duplicate.
    await publishWorkItem(topology, released, agent, this.publishing, `${jobId}:placed:${released.attempt}`);
  }

  /** A job whose agent was removed while it waited: it fails (`unknown_agent`) and lets go of its places. */
  private async agentRemoved(found: JobHandle, places: readonly string[]): Promise<void> {
    const { topology } = this;
    const { record } = found;
    const error = toErrorInfo(new BoxcarError(ErrorCode.unknownAgent, `agent ${record.agent} was removed while the job waited`));
    await topology.jobStore.change(found, (job) => JobTransitions.refuse(job, error, nowIso()));
    await this.leave(places, record.id);
  }

  /** Cancels a limit's jobs older than its newest `limit`, the running and the waiting, oldest first. */
  private async cancelOlder(place: string, limit: number): Promise<void> {
    const { topology } = this;
    const places = parsePlaces((await this.entry(place))?.string());
    const holders = Object.entries(places.holding)
      .sort(([, a], [, b]) => a - b)
      .map(([id]) => id);
    const waiting: string[] = [];
    const markers = storedMessages(topology.jsm, topology.names.streams.work, topology.names.subjects.heldWork(place, "*"), {
      from: places.cursor + 1,
    });
    for await (const stored of markers) {
      const jobId = markerJob(stored.data);
      const found = jobId === undefined ? undefined : await topology.jobStore.read(jobId);
      // One that ended while it waited is no one's to cancel, and takes no place.
      if (found && !isTerminal(found.record.state)) waiting.push(found.record.id);
    }
    const jobs = [...holders, ...waiting];
    for (const id of jobs.slice(0, Math.max(0, jobs.length - limit))) {
      await cancelJob(this.topology, id).catch((err: unknown) => {
        // Ended already (a conflict), or gone: nothing to cancel.
        if (!(err instanceof BoxcarError && (err.code === ErrorCode.conflict || err.code === ErrorCode.notFound))) throw err;
      });
    }
  }

  /**
   * Frees the places of jobs that ended with no dispatcher watching (or whose admission died
   * before their record), finishes a job given a place whose dispatcher died before its record
   * said so, and gives free places to the jobs waiting (a marker whose dispatcher died before it
   * was noted is found here).
   */
  private async sweep(): Promise<void> {
    const { topology } = this;
    const bucket = await topology.limits();
    const keys: string[] = [];
    for await (const key of await bucket.keys(`${ENTRY_PREFIX}>`)) keys.push(key);
    for (const key of keys) {
      if (this.sweeps.stopped) return;
      const place = key.slice(ENTRY_PREFIX.length);
      const entry = await this.entry(place);
      if (!entry) continue;
      const places = parsePlaces(entry.string());
      for (const [jobId, since] of Object.entries(places.holding)) {
        const found = await topology.jobStore.read(jobId);
        const stale = Date.now() - since > GRACE_MS;
        const concurrency = found?.record.concurrency;
        // A record that does not name the place yet (a delayed job's places are taken just before
        // its record says so) is given the same grace as no record.
        const named = concurrency !== undefined && placesOf(concurrency).includes(place);
        if (found && isTerminal(found.record.state)) await this.free(place, jobId);
        else if (!named) {
          if (stale) await this.free(place, jobId);
        } else if (found && concurrency?.waiting && stale) await this.finish(found, place);
      }
      // A limit nobody has held or waited for since a minute ago goes, so that one per key value
      // does not pile up (the next job of its key makes it again).
      const idle = count(places) === 0 && Date.now() - entry.created.getTime() > GRACE_MS;
      if (idle && !(await this.nextMarker(place, places.cursor + 1))) {
        await bucket.delete(key, { previousSeq: entry.revision }).catch(() => {}); // changed meanwhile: kept
        continue;
      }
      await this.removeHandled(place, places.cursor);
      this.kick(place);
    }
  }

  /**
   * A job that holds `place` and has waited since a while: given the place by a dispatcher that
   * died before it went on, it goes on now; waiting at a later limit with no marker there (its
   * dispatcher died before storing it), it gets one.
   */
  private async finish(found: JobHandle, place: string): Promise<void> {
    const concurrency = found.record.concurrency as Place;
    if (concurrency.place === place) return this.placed(found, place);
    const { jsm, names } = this.topology;
    // Given its place there meanwhile (its marker gone with it), it is that limit's sweep's.
    if (parsePlaces((await this.entry(concurrency.place))?.string()).holding[found.record.id] !== undefined) return;
    const marker = await jsm.streams.getMessage(names.streams.work, {
      last_by_subj: names.subjects.heldWork(concurrency.place, found.record.id),
    });
    if (marker) return;
    const agent = await this.agentOf(found.record.agent);
    if (!agent) return this.agentRemoved(found, placesOf(concurrency));
    await this.wait(found.record, agent, `${found.record.id}:${concurrency.place}:${found.record.attempt}:${Date.now()}`);
  }

  /** Removes the markers a limit's queue is past (a dispatcher died before it removed them). */
  private async removeHandled(place: string, cursor: number): Promise<void> {
    const { jsm, names } = this.topology;
    for await (const stored of storedMessages(jsm, names.streams.work, names.subjects.heldWork(place, "*"), { upTo: cursor })) {
      await this.removeMarker(stored.seq);
    }
  }

  private async nextMarker(place: string, from: number): Promise<{ seq: number; jobId: string | undefined } | undefined> {
    const { jsm, names } = this.topology;
    for await (const stored of storedMessages(jsm, names.streams.work, names.subjects.heldWork(place, "*"), { from })) {
      return { seq: stored.seq, jobId: markerJob(stored.data) };
    }
    return undefined;
  }

  private async removeMarker(seq: number): Promise<void> {
    await this.topology.jsm.streams.deleteMessage(this.topology.names.streams.work, seq, false).catch(() => false);
  }

  private async entry(place: string) {
    const entry = await (await this.topology.limits()).get(ENTRY_PREFIX + place);
    return entry?.operation === "PUT" ? entry : undefined;
  }

  /** Changes a limit's state by compare-and-swap: `edit` changes it in place and says whether it did (or what it did). */
  private async change<R>(place: string, edit: (places: Places) => R): Promise<R> {
    return this.entries.change(ENTRY_PREFIX + place, `agent ${agentName(place)}`, (held) => {
      const places = parsePlaces(held);
      const result = edit(places);
      return result ? { write: JSON.stringify(places), result } : { result };
    });
  }

  private async agentOf(name: string): Promise<AgentDefinition | undefined> {
    return this.agents.get(name).catch((err: unknown) => {
      if (err instanceof BoxcarError && err.code === ErrorCode.unknownAgent) return undefined;
      throw err;
    });
  }

  /** Stops the sweep and waits for the passes under way. */
  async stop(): Promise<void> {
    await this.sweeps.stop();
    await this.promotions.stop();
  }
}

/** The places a job holds: those before the one it waits at, or all of them. */
function heldBy(concurrency: Place): string[] {
  const places = placesOf(concurrency);
  return concurrency.waiting ? places.slice(0, places.indexOf(concurrency.place)) : places;
}

const agentName = (place: string): string => place.slice(0, place.indexOf("."));

const count = (places: Places): number => Object.keys(places.holding).length;

function parsePlaces(text: string | undefined): Places {
  const empty: Places = { holding: {}, cursor: 0, tail: 0 };
  if (text === undefined) return empty;
  try {
    const value = JSON.parse(text) as Partial<Places>;
    const holding = value.holding !== null && typeof value.holding === "object" ? value.holding : {};
    return {
      holding: Object.fromEntries(Object.entries(holding).filter(([, since]) => typeof since === "number")),
      cursor: typeof value.cursor === "number" ? value.cursor : 0,
      tail: typeof value.tail === "number" ? value.tail : 0,
    };
  } catch {
    return empty;
  }
}

function markerJob(data: Uint8Array): string | undefined {
  try {
    const jobId = (JSON.parse(new TextDecoder().decode(data)) as { jobId?: unknown }).jobId;
    return typeof jobId === "string" ? jobId : undefined;
  } catch {
    return undefined;
  }
}
