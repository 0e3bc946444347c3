/** New ids kept apart, in order, before they are merged into the main array: a merge copies it whole. */
const RECENT_MAX = 4_096;

/** The first place in `ids[0, end)` whose id is past `id` (the ids are sorted, each once). */
function firstPast(ids: readonly string[], id: string, end: number): number {
  const at = lowerBound(ids, id, end);
  return ids[at] === id ? at + 1 : at;
}

/** `ids` and their `slots` (at the same places), in the ids' order. */
function inOrder(ids: readonly string[], slots: ArrayLike<number>): { ids: string[]; slots: number[] } {
  const places = ids.map((_, k) => k).sort((a, b) => ((ids[a] as string) < (ids[b] as string) ? -1 : 1));
  return { ids: places.map((k) => ids[k] as string), slots: places.map((k) => slots[k] as number) };
}

/** The first place in `ids[0, end)` whose id is not below `id` (the ids are sorted). */
function lowerBound(ids: readonly string[], id: string, end = ids.length): number {
  let lo = 0;
  let hi = end;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if ((ids[mid] as string) < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * The job index's ids in ascending order, each with its slot, for walks newest or oldest first
 * that stay in order while jobs are added and removed, and that make nothing of the ids they
 * pass over.
 *
 * Ids sort by creation time, so most new ids go after the last one: pushed onto the main array.
 * One that goes before it (created in the same millisecond as another, or by another dispatcher
 * whose clock is behind) is pushed onto a small array of recent ids, sorted when a walk needs
 * it, and every `RECENT_MAX` of those are merged into a new main array: inserting into the main
 * array itself copied it whole, 12 ms a job at a million (docs/benchmarks.md, "Listing jobs").
 * The watch's replay at start comes in store order: pushed as it comes and sorted once, when a
 * walk first needs it; so are recent ids that fill up with no walk since the last merge.
 *
 * A walk keeps the arrays it began with: a merge or a compaction makes new ones, and a push
 * lands past the end it began with. A slot is given to another job only after a compaction:
 * a walk begun before one looks its ids' slots up again.
 */
export class IdOrder {
  private main: string[] = [];
  /** `main[i]`'s slot is `mainSlots[i]`. */
  private mainSlots = new Int32Array(1_024);
  /** New ids that go before main's last, and their slots, as they came. */
  private recent: string[] = [];
  private recentSlots: number[] = [];
  /** The same in order, made when a walk or a merge needs them (a walk keeps the one it began with). */
  private recentInOrder: { ids: string[]; slots: number[] } | undefined;
  /** Whether `main` is in order: not until the first walk after a start. */
  private sorted = false;
  /** Compactions so far. */
  private compactions = 0;
  /** Whether a walk began since the recent ids were last merged in. */
  private walkedSinceMerge = false;

  /** How many ids it holds, those of jobs removed since the last compaction included. */
  get size(): number {
    return this.main.length + this.recent.length;
  }

  add(id: string, slot: number): void {
    const main = this.main;
    if (!this.sorted || main.length === 0 || id > (main[main.length - 1] as string)) {
      this.push(id, slot);
      return;
    }
    this.recent.push(id);
    this.recentSlots.push(slot);
    this.recentInOrder = undefined;
    if (this.recent.length < RECENT_MAX) return;
    // Merged in, if a walk came since the last merge; else (a replay still under way, say) left
    // for the next walk to sort with the rest, once: a merge per `RECENT_MAX` ids made a replay
    // of a million in random order take 30 s.
    if (this.walkedSinceMerge) this.rebuild(() => true);
    else {
      for (const [k, recentId] of this.recent.entries()) this.push(recentId, this.recentSlots[k] as number);
      this.recent = [];
      this.recentSlots = [];
      this.sorted = false;
    }
    this.walkedSinceMerge = false;
  }

  private push(id: string, slot: number): void {
    this.main.push(id);
    if (this.main.length > this.mainSlots.length) {
      const grown = new Int32Array(this.mainSlots.length * 2);
      grown.set(this.mainSlots);
      this.mainSlots = grown;
    }
    this.mainSlots[this.main.length - 1] = slot;
  }

  /**
   * Drops the ids whose slot `removed` says is free now (new arrays); resolves with what it
   * dropped, whose slots may then be given to other jobs.
   */
  compact(removed: (slot: number) => boolean): { id: string; slot: number }[] {
    const dropped: { id: string; slot: number }[] = [];
    this.rebuild((id, slot) => {
      if (!removed(slot)) return true;
      dropped.push({ id, slot });
      return false;
    });
    this.compactions += 1;
    return dropped;
  }

  /**
   * The ids in order whose slot `wanted` wants, with it, newest first (`step` -1) or oldest
   * first (1), starting after `after` when given. A slot is as it was when the walk began until
   * a compaction: from then on (it may be another job's) it is looked up by `slotOf`, and an id
   * it has not (its job removed) is passed over.
   */
  *walk(
    after: string | undefined,
    step: 1 | -1,
    slotOf: (id: string) => number | undefined,
    wanted: (slot: number) => boolean,
  ): Generator<[string, number]> {
    if (!this.sorted) {
      this.rebuild(() => true, true);
      this.sorted = true;
    }
    this.walkedSinceMerge = true;
    const { main, mainSlots, compactions } = this;
    const { ids: recent, slots: recentSlots } = this.ordered();
    const end = main.length;
    const slotAt = (ids: readonly string[], slots: ArrayLike<number>, k: number) =>
      compactions === this.compactions ? slots[k] : slotOf(ids[k] as string);
    // Main's first place from `from` on, short of `stop`, whose slot is wanted (else `stop`): a
    // plain loop, which V8 optimizes while it runs, where a generator's first long walk would not be.
    const scan = (from: number, stop: number): number => {
      for (let k = from; k !== stop; k += step) {
        const slot = slotAt(main, mainSlots, k);
        if (slot !== undefined && wanted(slot)) return k;
      }
      return stop;
    };
    // Where a walk begins in `ids[0, n)`: past `after` in the walk's direction, if given.
    const first = (ids: readonly string[], n: number): number => {
      if (step === 1) return after === undefined ? 0 : firstPast(ids, after, n);
      return (after === undefined ? n : lowerBound(ids, after, n)) - 1;
    };
    // Two cursors merged: `i` in main, `j` in recent (few, if any).
    let i = first(main, end);
    let j = first(recent, recent.length);
    for (;;) {
      const next = j >= 0 && j < recent.length ? (recent[j] as string) : undefined;
      // Main's ids that come before recent's next: up to where it would go in main.
      const bound = next === undefined ? (step === 1 ? end : 0) : lowerBound(main, next, end);
      const stop = step === 1 ? Math.max(bound, i) : Math.min(bound - 1, i);
      for (i = scan(i, stop); i !== stop; i = scan(i + step, stop)) yield [main[i] as string, slotAt(main, mainSlots, i) as number];
      if (next === undefined) return;
      const slot = slotAt(recent, recentSlots, j);
      if (slot !== undefined && wanted(slot)) yield [next, slot];
      j += step;
    }
  }

  /**
   * New arrays of the ids `keep` keeps, the recent ones merged in (in order when the main array
   * is; else sorted, `sort`).
   */
  private rebuild(keep: (id: string, slot: number) => boolean, sort = false): void {
    const { main, mainSlots } = this;
    const { ids: recent, slots: recentSlots } = this.ordered();
    const ids: string[] = [];
    const slots: number[] = [];
    const take = (id: string, slot: number) => {
      if (!keep(id, slot)) return;
      ids.push(id);
      slots.push(slot);
    };
    let i = 0;
    let j = 0;
    while (i < main.length || j < recent.length) {
      // Unsorted, the order does not matter yet: it is sorted below.
      if (j >= recent.length || (i < main.length && (main[i] as string) < (recent[j] as string))) {
        take(main[i] as string, mainSlots[i] as number);
        i += 1;
      } else {
        take(recent[j] as string, recentSlots[j] as number);
        j += 1;
      }
    }
    const kept = sort ? inOrder(ids, slots) : { ids, slots };
    this.main = kept.ids;
    this.mainSlots = new Int32Array(Math.max(1_024, ids.length * 2));
    this.mainSlots.set(kept.slots);
    this.recent = [];
    this.recentSlots = [];
    this.recentInOrder = undefined;
  }

  /** The recent ids in order, with their slots. */
  private ordered(): { ids: string[]; slots: number[] } {
    this.recentInOrder ??= inOrder(this.recent, this.recentSlots);
    return this.recentInOrder;
  }
}
