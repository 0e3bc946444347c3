import { handoffPending, isTerminal, type JobRecord, JobState, ownerOf } from "@boxcar/protocol";
import { IdOrder } from "./id-order.js";

/** What the index keeps of a job: what a list filters on, how big its record is, and what retention and quotas need. */
export interface IndexedJob {
  state: JobState;
  agent: string;
  pool: string;
  owner: string;
  /** The record's size as stored, in bytes: a list reads only the records its page can hold. */
  bytes: number;
  /** The sizes of its artifacts, summed. */
  artifacts: number;
  /** When it ended (its `finishedAt`, else its `createdAt`), in ms; NaN while it has not. */
  endedAt: number;
}

/** Which jobs a walk of the index yields: all of these that are given. */
export interface JobFilter {
  state?: JobState;
  agent?: string;
  pool?: string;
  /** Whether the jobs of `owner` are wanted (asked at most once per owner in a walk). */
  owner?: (owner: string) => boolean;
}

/**
 * The index's settled jobs, as columns oldest first, and the ids of the rest: what a snapshot of
 * it keeps (`index-image.ts` writes it as bytes). A settled job is one only the index needs at a
 * start: ended, with nothing left to do for it (see `isSettled`).
 */
export interface IndexImage {
  ids: string[];
  states: Uint8Array;
  /** Numbers in `names`. */
  agents: Uint32Array;
  pools: Uint32Array;
  owners: Uint32Array;
  names: string[];
  bytes: Float64Array;
  artifacts: Float64Array;
  endedAt: Float64Array;
  /** The jobs not settled: a start reads their records again and shows them to every observer. */
  unsettled: string[];
}

/**
 * Whether only the job index needs `job`'s record at a start: it has ended, and nothing is left
 * to do for it. Of the watch's other observers, only two act on an ended record: the handoffs
 * (a handoff not yet decided) and the provider pauses (a pause still to come); the rest look at
 * jobs waiting or running, or (a workflow run's step, a schedule's tick) are found again from
 * their own buckets.
 */
export function isSettled(job: JobRecord, now = Date.now()): boolean {
  if (!isTerminal(job.state) || handoffPending(job)) return false;
  return job.providerLimitedUntil === undefined || Date.parse(job.providerLimitedUntil) <= now;
}

/** Told each change of a job the index has: what it was (undefined: unknown) and what it is (undefined: deleted). */
export type JobChange = (id: string, before: IndexedJob | undefined, after: IndexedJob | undefined) => void;

const STATES = JobState.options;
const STATE_CODE = new Map(STATES.map((s, i) => [s, i]));
/** A job deleted since its id was listed (its slot kept until a compaction). */
const REMOVED = 255;

/**
 * Strings many jobs share (agents, pools, owners), each kept once, by a small number; a number
 * no job uses any more is given to the next new string.
 */
class Names {
  private readonly codes = new Map<string, number>();
  private readonly names: string[] = [];
  private readonly uses: number[] = [];
  private readonly unused: number[] = [];

  /** The code of `name`, counting one more use of it. */
  take(name: string): number {
    let code = this.codes.get(name);
    if (code === undefined) {
      code = this.unused.pop() ?? this.names.length;
      this.codes.set(name, code);
      this.names[code] = name;
      this.uses[code] = 0;
    }
    this.uses[code] = (this.uses[code] as number) + 1;
    return code;
  }

  /** One use of `code` less; at none, the code is free. */
  drop(code: number): void {
    const left = (this.uses[code] as number) - 1;
    this.uses[code] = left;
    if (left > 0) return;
    this.codes.delete(this.names[code] as string);
    this.unused.push(code);
  }

  name(code: number): string {
    return this.names[code] as string;
  }

  /** Every name by its code (a free code's is a name no job uses). */
  all(): string[] {
    return [...this.names];
  }

  /** The code of `name` if a job uses it. */
  codeOf(name: string): number | undefined {
    return this.codes.get(name);
  }
}

/**
 * Every job the dispatcher's watch has shown it, by id, with what `jobs.list` filters on, the
 * size of its record, when it ended and the sizes of its artifacts: so a list walks this in
 * memory, newest first, and reads only the records its page can hold, however many jobs the
 * bucket holds and however big their records are; retention finds the ended jobs due, and the
 * quotas (`JobLoad`, told each change) count each owner's jobs, from this one entry a job.
 *
 * An entry is a slot in a few typed arrays: a state's number, the numbers of its agent, pool
 * and owner (`Names`: each string kept once), its sizes and end time; the id, in a map to its
 * slot and in the ids in order. About 100 bytes a job, where an object a job in each of three
 * maps was about 400 (docs/benchmarks.md, "Listing jobs"). It trails the bucket by the watch's
 * delay; a list reads each record it returns, so what it returns is current.
 */
export class JobIndex {
  /** Each id's slot; a removed job's stays until a compaction (its state `REMOVED`). */
  private readonly slots = new Map<string, number>();
  private readonly names = new Names();
  private capacity = 1024;
  private stateOf = new Uint8Array(this.capacity);
  private agentOf = new Uint32Array(this.capacity);
  private poolOf = new Uint32Array(this.capacity);
  private ownerOf = new Uint32Array(this.capacity);
  private bytesOf = new Float64Array(this.capacity);
  private artifactsOf = new Float64Array(this.capacity);
  private endedAtOf = new Float64Array(this.capacity);
  /** 1 where the job is settled (`isSettled`). */
  private settledOf = new Uint8Array(this.capacity);
  private nextSlot = 0;
  private readonly freeSlots: number[] = [];
  private readonly listeners: JobChange[] = [];
  /** How many jobs are in each state. */
  private readonly states = new Map<JobState, number>();
  /** How many jobs of each owner and agent are in each state (no empty entries: owners and agents come and go). */
  private readonly tallies = new Map<string, Map<string, Map<JobState, number>>>();
  /** Every id in `slots`, in order, with its slot; removed ones until a compaction. */
  private readonly order = new IdOrder();
  private removed = 0;

  /** Tells `listener` every change from now on, after the index has it. */
  onChange(listener: JobChange): void {
    this.listeners.push(listener);
  }

  /**
   * Notes a job record's latest value (undefined: the record was deleted) and its size as stored
   * (the watch gives it; else it is measured).
   */
  readonly observe = (key: string, job: JobRecord | undefined, bytes?: number): void => {
    if (!job) {
      this.note(key, undefined, false);
      return;
    }
    let artifacts = 0;
    for (const a of job.artifacts ?? []) artifacts += a.size;
    const entry: IndexedJob = {
      state: job.state,
      agent: job.agent,
      pool: job.pool,
      owner: ownerOf(job),
      bytes: bytes ?? Buffer.byteLength(JSON.stringify(job)),
      artifacts,
      endedAt: isTerminal(job.state) ? Date.parse(job.finishedAt ?? job.createdAt) : Number.NaN,
    };
    this.note(key, entry, isSettled(job));
  };

  /** Notes a job's entry (undefined: deleted), and whether it is settled. */
  private note(key: string, job: IndexedJob | undefined, settled: boolean): void {
    let slot = this.slots.get(key);
    const before = slot === undefined ? undefined : this.entry(slot);
    if (before) {
      this.states.set(before.state, (this.states.get(before.state) ?? 1) - 1);
      this.tally(before, -1);
      this.release(slot as number);
    }
    if (!job) {
      if (before) {
        this.stateOf[slot as number] = REMOVED;
        this.removed += 1;
        if (this.removed > 1_000 && this.removed > this.order.size / 4) this.compact();
      }
      for (const listener of this.listeners) listener(key, before, undefined);
      return;
    }
    if (slot === undefined) {
      slot = this.newSlot();
      this.slots.set(key, slot);
      this.order.add(key, slot);
    } else if (!before) this.removed -= 1; // made again with the same id: its slot and place are there
    this.stateOf[slot] = STATE_CODE.get(job.state) as number;
    this.agentOf[slot] = this.names.take(job.agent);
    this.poolOf[slot] = this.names.take(job.pool);
    this.ownerOf[slot] = this.names.take(job.owner);
    this.bytesOf[slot] = job.bytes;
    this.artifactsOf[slot] = job.artifacts;
    this.endedAtOf[slot] = job.endedAt;
    this.settledOf[slot] = settled ? 1 : 0;
    this.states.set(job.state, (this.states.get(job.state) ?? 0) + 1);
    this.tally(job, 1);
    for (const listener of this.listeners) listener(key, before, job);
  }

  /** The settled jobs' entries and the other jobs' ids, as they stand: what a snapshot keeps. */
  image(): IndexImage {
    const n = this.size;
    const [states, agents, pools, owners] = [new Uint8Array(n), new Uint32Array(n), new Uint32Array(n), new Uint32Array(n)];
    const [bytes, artifacts, endedAt] = [new Float64Array(n), new Float64Array(n), new Float64Array(n)];
    const ids: string[] = [];
    const unsettled: string[] = [];
    const present = (slot: number) => this.stateOf[slot] !== REMOVED;
    for (const [id, slot] of this.order.walk(undefined, 1, (id) => this.slots.get(id), present)) {
      if (this.settledOf[slot] !== 1) {
        unsettled.push(id);
        continue;
      }
      const i = ids.push(id) - 1;
      states[i] = this.stateOf[slot] as number;
      agents[i] = this.agentOf[slot] as number;
      pools[i] = this.poolOf[slot] as number;
      owners[i] = this.ownerOf[slot] as number;
      bytes[i] = this.bytesOf[slot] as number;
      artifacts[i] = this.artifactsOf[slot] as number;
      endedAt[i] = this.endedAtOf[slot] as number;
    }
    const k = ids.length;
    return {
      ids,
      states: states.subarray(0, k),
      agents: agents.subarray(0, k),
      pools: pools.subarray(0, k),
      owners: owners.subarray(0, k),
      names: this.names.all(),
      bytes: bytes.subarray(0, k),
      artifacts: artifacts.subarray(0, k),
      endedAt: endedAt.subarray(0, k),
      unsettled,
    };
  }

  /**
   * Notes every settled job of `image` (a snapshot's, checked when it was read) as the watch
   * would have; the unsettled ones are left to their records, which the caller reads.
   */
  restore(image: IndexImage): void {
    const { names } = image;
    for (const [i, id] of image.ids.entries()) {
      const entry: IndexedJob = {
        state: STATES[image.states[i] as number] as JobState,
        agent: names[image.agents[i] as number] as string,
        pool: names[image.pools[i] as number] as string,
        owner: names[image.owners[i] as number] as string,
        bytes: image.bytes[i] as number,
        artifacts: image.artifacts[i] as number,
        endedAt: image.endedAt[i] as number,
      };
      this.note(id, entry, true);
    }
  }

  /** The job in `slot`, undefined if removed. */
  private entry(slot: number): IndexedJob | undefined {
    const state = this.stateOf[slot] as number;
    if (state === REMOVED) return undefined;
    return {
      state: STATES[state] as JobState,
      agent: this.names.name(this.agentOf[slot] as number),
      pool: this.names.name(this.poolOf[slot] as number),
      owner: this.names.name(this.ownerOf[slot] as number),
      bytes: this.bytesOf[slot] as number,
      artifacts: this.artifactsOf[slot] as number,
      endedAt: this.endedAtOf[slot] as number,
    };
  }

  /** Lets go of the names the job in `slot` uses. */
  private release(slot: number): void {
    this.names.drop(this.agentOf[slot] as number);
    this.names.drop(this.poolOf[slot] as number);
    this.names.drop(this.ownerOf[slot] as number);
  }

  private newSlot(): number {
    const free = this.freeSlots.pop();
    if (free !== undefined) return free;
    if (this.nextSlot === this.capacity) this.grow();
    return this.nextSlot++;
  }

  private grow(): void {
    this.capacity *= 2;
    const grown = <T extends Uint8Array | Uint32Array | Float64Array>(old: T, make: new (n: number) => T): T => {
      const next = new make(this.capacity);
      next.set(old);
      return next;
    };
    this.stateOf = grown(this.stateOf, Uint8Array);
    this.agentOf = grown(this.agentOf, Uint32Array);
    this.poolOf = grown(this.poolOf, Uint32Array);
    this.ownerOf = grown(this.ownerOf, Uint32Array);
    this.bytesOf = grown(this.bytesOf, Float64Array);
    this.artifactsOf = grown(this.artifactsOf, Float64Array);
    this.endedAtOf = grown(this.endedAtOf, Float64Array);
    this.settledOf = grown(this.settledOf, Uint8Array);
  }

  private tally(job: IndexedJob, by: 1 | -1): void {
    const agents = this.tallies.get(job.owner) ?? new Map<string, Map<JobState, number>>();
    const states = agents.get(job.agent) ?? new Map<JobState, number>();
    const n = (states.get(job.state) ?? 0) + by;
    if (n > 0) states.set(job.state, n);
    else states.delete(job.state);
    if (states.size > 0) agents.set(job.agent, states);
    else agents.delete(job.agent);
    if (agents.size > 0) this.tallies.set(job.owner, agents);
    else this.tallies.delete(job.owner);
  }

  get size(): number {
    return this.slots.size - this.removed;
  }

  /** Whether the index has job `id`. */
  has(id: string): boolean {
    const slot = this.slots.get(id);
    return slot !== undefined && this.stateOf[slot] !== REMOVED;
  }

  /** Whether the index has job `id` as ended. */
  isEnded(id: string): boolean {
    const slot = this.slots.get(id);
    return slot !== undefined && this.stateOf[slot] !== REMOVED && !Number.isNaN(this.endedAtOf[slot]);
  }

  /** How many jobs are in `state`. */
  count(state: JobState): number {
    return this.states.get(state) ?? 0;
  }

  /**
   * How many jobs are in each state (every state, 0 where none is), counting only owners `sees`
   * lets through and, given `agent`, only its jobs: a sum over owners and agents, not over jobs.
   */
  counts(sees: (owner: string) => boolean, agent?: string): Record<JobState, number> {
    const counts = Object.fromEntries(STATES.map((s) => [s, 0])) as Record<JobState, number>;
    for (const [owner, agents] of this.tallies) {
      if (!sees(owner)) continue;
      for (const [name, states] of agents) {
        if (agent !== undefined && name !== agent) continue;
        for (const [state, n] of states) counts[state] += n;
      }
    }
    return counts;
  }

  /**
   * The jobs that match `filter`, newest first, starting after `after` (a job id) when given.
   * The filter is checked on the entry's numbers, so a walk passes the jobs it leaves out
   * without making anything of them.
   */
  *newestFirst(after?: string, filter: JobFilter = {}): Generator<[string, IndexedJob]> {
    yield* this.walk(after, filter, -1);
  }

  /** The ended jobs, oldest first. */
  *ended(): Generator<[string, IndexedJob]> {
    yield* this.walk(undefined, { ended: true }, 1);
  }

  private *walk(after: string | undefined, filter: JobFilter & { ended?: boolean }, step: 1 | -1): Generator<[string, IndexedJob]> {
    const state = filter.state === undefined ? undefined : STATE_CODE.get(filter.state);
    const agent = filter.agent === undefined ? undefined : this.names.codeOf(filter.agent);
    const pool = filter.pool === undefined ? undefined : this.names.codeOf(filter.pool);
    // A name no job has: none matches.
    if ((filter.agent !== undefined && agent === undefined) || (filter.pool !== undefined && pool === undefined)) return;
    const owners = new Map<string, boolean>(); // by name: a code may be given to another owner during the walk
    const wants = (owner: string): boolean => {
      let wanted = owners.get(owner);
      if (wanted === undefined) {
        wanted = filter.owner?.(owner) ?? true;
        owners.set(owner, wanted);
      }
      return wanted;
    };
    // No job of the owners wanted has that state and agent: nothing to walk.
    if (filter.pool === undefined && !filter.ended && !this.anyTallied(filter, wants)) return;
    const wantedSlot = (slot: number): boolean =>
      this.stateOf[slot] !== REMOVED &&
      (state === undefined || this.stateOf[slot] === state) &&
      (agent === undefined || this.agentOf[slot] === agent) &&
      (pool === undefined || this.poolOf[slot] === pool) &&
      !(filter.ended && Number.isNaN(this.endedAtOf[slot])) &&
      !(filter.owner && !wants(this.names.name(this.ownerOf[slot] as number)));
    // The slot's arrays are read at each step: they are replaced as they grow.
    for (const [id, slot] of this.order.walk(after, step, (id) => this.slots.get(id), wantedSlot)) {
      yield [id, this.entry(slot) as IndexedJob];
    }
  }

  /** Whether any job has the filter's state and agent, of an owner it wants, by the tallies (the pool is not tallied). */
  private anyTallied(filter: JobFilter, wants: (owner: string) => boolean): boolean {
    for (const [owner, agents] of this.tallies) {
      if (!wants(owner)) continue;
      for (const [name, states] of agents) {
        if (filter.agent !== undefined && name !== filter.agent) continue;
        if (filter.state === undefined || (states.get(filter.state) ?? 0) > 0) return true;
      }
    }
    return false;
  }

  /** Drops the removed jobs' ids and frees their slots. */
  private compact(): void {
    for (const { id, slot } of this.order.compact((slot) => this.stateOf[slot] === REMOVED)) {
      this.slots.delete(id);
      this.freeSlots.push(slot);
    }
    this.removed = 0;
  }
}
