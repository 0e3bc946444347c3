import type { Logger } from "@boxcar/client";
import { type JobHandle, jobEvent, nowIso, publishEvent, storedMessages, type Topology } from "@boxcar/fabric";
import { type AgentDefinition, BoxcarError, ErrorCode, isTerminal, type JobRecord, JobTransitions, toErrorInfo } from "@boxcar/protocol";
import { publishWorkItem, type WorkPublishing } from "./admission.js";
import type { AgentCatalog } from "./agent-catalog.js";
import { cancelJob } from "./jobs.js";
import { type KeyedJob, LimitEntries, valueDigest } from "./limit-state.js";
import { PassPerKey, Periodic } from "./periodic.js";
import { SeenOnce } from "./seen-once.js";

/** A job's place under its agent's concurrency limit, as its record keeps it. */
export type Place = NonNullable<JobRecord["concurrency"]>;

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
 * at most `limit` of its jobs (or of each value of its `key`) hold a place at once, from when
 * one is let go to the workers until it ends, across every dispatcher and worker, with no lock.
 *
 * Each limit's state is one entry of the limits bucket, changed by compare-and-swap. A job
 * admitted while the limit has a free place takes it (one read and one write) and is published
 * as any job; one that finds none waits as a marker, `<prefix>.work.~held.<place>`, in the work
 * stream, which no consumer takes. When a job that holds a place ends, the dispatchers (each sees
 * every record) free its place and give it to the oldest marker's job: its record stops waiting,
 * then its work item is published. A sweep frees what an end seen by no dispatcher left held,
 * and finishes what a dispatcher that died half-way left undone.
 */
export class ConcurrencyLimits {
  private readonly sweeps: Periodic<void>;
  /** Gives a place's free places to its waiting jobs, one pass at a time per place. */
  private readonly promotions: PassPerKey;
  /** The ends this dispatcher freed a place for: a record seen twice frees once. */
  private readonly freed = new SeenOnce();
  private live = false;
  private closed = false;
  private readonly publishing: WorkPublishing;
  /** The limits bucket's entries, as this dispatcher changes them (rate limits' too). */
  readonly entries: LimitEntries;

  constructor(
    private readonly topology: Topology,
    private readonly agents: Pick<AgentCatalog, "get">,
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
    this.sweeps = new Periodic(
      () => this.sweep(),
      intervalMs,
      (err) => log.warn({ err }, "could not sweep the concurrency limits"),
    );
  }

  /**
   * A place for a new job of `agent` (one with `concurrency`): held now, when the limit has one
   * free and nobody waits, or one to wait for. `drop-new` refuses the job instead (`conflict`).
   */
  async enter(agent: AgentDefinition, job: KeyedJob & { id: string }): Promise<Place> {
    const limit = agent.concurrency;
    if (!limit) throw new BoxcarError(ErrorCode.internal, `agent ${agent.name} has no concurrency limit`);
    const place = placeOf(agent, job);
    return this.entries.change<Place>(ENTRY_PREFIX + place, `agent ${agent.name}`, (held) => {
      const places = parsePlaces(held);
      if (places.holding[job.id] !== undefined) return { result: { place } };
      if (count(places) < limit.limit && places.cursor >= places.tail) {
        places.holding[job.id] = Date.now();
        return { write: JSON.stringify(places), result: { place } };
      }
      if (limit.strategy === "drop-new") {
        throw new BoxcarError(
          ErrorCode.conflict,
          `agent ${agent.name} runs at most ${limit.limit} jobs at once${limit.key ? ` for each ${limit.key}` : ""} and has no place free; its concurrency strategy drops new jobs: submit again later`,
        );
      }
      return { result: { place, waiting: true as const } };
    });
  }

  /**
   * Stores the marker a job waiting for a place waits as (deduplicated by `msgID`), notes it in
   * its limit's queue, and gives it a place if one is free by then. Under `cancel-in-progress`,
   * the jobs older than the newest `limit` are cancelled first, running or waiting.
   */
  async wait(record: JobRecord, agent: AgentDefinition, msgID: string): Promise<void> {
    const place = record.concurrency?.place;
    if (place === undefined) throw new BoxcarError(ErrorCode.internal, `job ${record.id} has no concurrency place`);
    const { js, names } = this.topology;
    const { seq } = await js.publish(names.subjects.heldWork(place, record.id), JSON.stringify({ jobId: record.id }), { msgID });
    await this.change(place, (places) => {
      if (places.tail >= seq) return false;
      places.tail = seq;
      return true;
    });
    if (agent.concurrency?.strategy === "cancel-in-progress") await this.cancelOlder(place, agent.concurrency.limit);
    this.kick(place);
  }

  /** Shown each job record by the dispatcher's watch: a job that held a place and ended frees it. */
  readonly observe = (_key: string, job: JobRecord | undefined): void => {
    if (!this.live || !job?.concurrency || job.concurrency.waiting || !isTerminal(job.state)) return;
    // Once per end (a job retried by `boxcar retry` ends again, later).
    const end = `${job.id}@${job.finishedAt}`;
    if (!this.freed.first(end)) return;
    void this.free(job.concurrency.place, job.id).catch((err: unknown) =>
      this.log.warn({ err, jobId: job.id }, "could not free an ended job's concurrency place; the sweep will"),
    );
  };

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
    this.promotions.run(place);
  }

  /** Gives free places to the oldest waiting jobs, passing over the markers of jobs that ended while they waited. */
  private async promote(place: string): Promise<void> {
    const agent = await this.agentOf(place);
    const limit = agent?.concurrency?.limit ?? Number.POSITIVE_INFINITY;
    while (!this.closed) {
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
      if (outcome === "taken" && found) await this.placed(found, agent);
      if (outcome) await this.removeMarker(marker.seq);
    }
  }

  /**
   * A job given a place: its record stops waiting, then its work item goes to its pool. An agent
   * removed while it waited fails it (`unknown_agent`) and frees the place; so does a job that
   * ended meanwhile.
   */
  private async placed(found: JobHandle, agent: AgentDefinition | undefined): Promise<void> {
    const { topology } = this;
    const jobId = found.record.id;
    const place = found.record.concurrency?.place as string;
    if (!agent) {
      const error = toErrorInfo(new BoxcarError(ErrorCode.unknownAgent, `agent ${found.record.agent} was removed while the job waited`));
      const refused = await topology.jobStore.change(found, (job) => JobTransitions.refuse(job, error, nowIso()));
      if (refused.written) await publishEvent(topology, jobEvent(refused.handle.record, "failed", { error, message: error.message }));
      await this.free(place, jobId);
      return;
    }
    const given = await topology.jobStore.change(found, JobTransitions.givePlace);
    if (!given.written) {
      if (!given.current || isTerminal(given.current.record.state)) await this.free(place, jobId);
      return;
    }
    const record = given.handle.record;
    await publishEvent(topology, jobEvent(record, "released", { message: "given a place under its agent's concurrency limit" }));
    // A job given a place again after `boxcar retry` is on a later attempt: its item is not a duplicate.
    await publishWorkItem(topology, record, agent, this.publishing, `${jobId}:placed:${record.attempt}`);
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
      if (this.closed) return;
      const place = key.slice(ENTRY_PREFIX.length);
      const entry = await this.entry(place);
      if (!entry) continue;
      const places = parsePlaces(entry.string());
      for (const [jobId, since] of Object.entries(places.holding)) {
        const found = await topology.jobStore.read(jobId);
        const stale = Date.now() - since > GRACE_MS;
        if (found ? isTerminal(found.record.state) : stale) await this.free(place, jobId);
        else if (found?.record.concurrency?.waiting && stale) await this.placed(found, await this.agentOf(place));
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

  private async agentOf(place: string): Promise<AgentDefinition | undefined> {
    return this.agents.get(agentName(place)).catch((err: unknown) => {
      if (err instanceof BoxcarError && err.code === ErrorCode.unknownAgent) return undefined;
      throw err;
    });
  }

  /** Stops the sweep and waits for the passes under way. */
  async close(): Promise<void> {
    this.closed = true;
    await this.sweeps.close();
    await this.promotions.close();
  }
}

/** The limit a job of `agent` holds a place under: the agent's name, and its key's value (a digest) or `all`. */
function placeOf(agent: AgentDefinition, job: KeyedJob): string {
  return `${agent.name}.${valueDigest(agent.concurrency?.key, job) ?? "all"}`;
}

function agentName(place: string): string {
  return place.slice(0, place.indexOf("."));
}

function count(places: Places): number {
  return Object.keys(places.holding).length;
}

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
