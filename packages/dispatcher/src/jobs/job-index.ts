import { type JobRecord, JobState, ownerOf } from "@boxcar/protocol";

/** What the index keeps of a job: what a list filters on, and how big its record is. */
export interface IndexedJob {
  state: JobState;
  agent: string;
  pool: string;
  owner: string;
  /** The record's size as stored, in bytes: a list reads only the records its page can hold. */
  bytes: number;
}

/**
 * Every job the dispatcher's watch has shown it, by id, with what `jobs.list` filters on and the
 * size of its record: so a list walks this in memory, newest first, and reads only the records
 * its page can hold, however many jobs the bucket holds and however big their records are. It
 * trails the bucket by the watch's delay; a list reads each record it returns, so what it
 * returns is current.
 */
export class JobIndex {
  private readonly jobs = new Map<string, IndexedJob>();
  /** How many jobs are in each state. */
  private readonly states = new Map<JobState, number>();
  /** How many jobs of each owner and agent are in each state (no empty entries: owners and agents come and go). */
  private readonly tallies = new Map<string, Map<string, Map<JobState, number>>>();
  /** Ids in ascending order once sorted; may still hold ids removed since (skipped, then compacted). */
  private ids: string[] = [];
  /** The ids in `ids`. */
  private listed = new Set<string>();
  private sorted = true;
  private removed = 0;

  /**
   * Notes a job record's latest value (undefined: the record was deleted) and its size as stored
   * (the watch gives it; else it is measured).
   */
  readonly observe = (key: string, job: JobRecord | undefined, bytes?: number): void => {
    const before = this.jobs.get(key);
    if (before) {
      this.states.set(before.state, (this.states.get(before.state) ?? 1) - 1);
      this.tally(before, -1);
    }
    const after = job && {
      state: job.state,
      agent: job.agent,
      pool: job.pool,
      owner: ownerOf(job),
      bytes: bytes ?? Buffer.byteLength(JSON.stringify(job)),
    };
    if (after) {
      this.states.set(after.state, (this.states.get(after.state) ?? 0) + 1);
      this.tally(after, 1);
    }
    if (!after) {
      if (this.jobs.delete(key)) this.removed += 1;
      if (this.removed > 1_000 && this.removed > this.ids.length / 2) this.compact();
      return;
    }
    if (!this.listed.has(key)) this.insert(key);
    this.jobs.set(key, after);
  };

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

  /**
   * Ids sort by creation time, so a new job goes at the end, or near it (another dispatcher's
   * clock); the watch's replay at start comes in store order, which is sorted once, when a list
   * first needs it.
   */
  private insert(id: string): void {
    this.listed.add(id);
    const ids = this.ids;
    if (!this.sorted || ids.length === 0 || id > (ids[ids.length - 1] as string)) {
      ids.push(id);
      return;
    }
    const at = this.position(id);
    if (ids.length - at <= 1_000)
      this.ids = [...ids.slice(0, at), id, ...ids.slice(at)]; // a new array: see newestFirst
    else {
      ids.push(id);
      this.sorted = false;
    }
  }

  /** The index of the first id not below `id` (binary search; the ids are sorted). */
  private position(id: string): number {
    let lo = 0;
    let hi = this.ids.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((this.ids[mid] as string) < id) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  get size(): number {
    return this.jobs.size;
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
    const counts = Object.fromEntries(JobState.options.map((s) => [s, 0])) as Record<JobState, number>;
    for (const [owner, agents] of this.tallies) {
      if (!sees(owner)) continue;
      for (const [name, states] of agents) {
        if (agent !== undefined && name !== agent) continue;
        for (const [state, n] of states) counts[state] += n;
      }
    }
    return counts;
  }

  /** The jobs, newest first, starting after `after` (a job id) when given. */
  *newestFirst(after?: string): Generator<[string, IndexedJob]> {
    if (!this.sorted) {
      this.compact(); // a new array: a walk under way keeps the one it has
      this.ids.sort();
      this.sorted = true;
    }
    // This array as it is now: an insertion or a compaction later makes a new one, or adds
    // past the end, so the walk below stays in order.
    const ids = this.ids;
    for (let i = after === undefined ? ids.length - 1 : this.position(after) - 1; i >= 0; i--) {
      const id = ids[i] as string;
      const job = this.jobs.get(id);
      if (job) yield [id, job];
    }
  }

  private compact(): void {
    this.ids = this.ids.filter((id) => this.jobs.has(id));
    this.listed = new Set(this.ids);
    this.removed = 0;
  }
}
