import { ownerOf, type WorkflowRun } from "@boxcar/protocol";

/** What the index keeps of a run: what `workflows.list` filters on. */
interface IndexedRun {
  state: string;
  owner: string;
  workflow: string;
  /** Where it sorts: its creation time, then its id (a run started with a key has a hashed id). */
  order: string;
}

/**
 * Every workflow run the dispatcher's watch has shown it, by id, with what a list filters on:
 * a list walks this in memory, newest first, and reads only the records of its page, however
 * many runs the bucket holds. It trails the bucket by the watch's
 * delay, except for the runs this dispatcher starts, which it notes at once.
 */
export class RunIndex {
  private readonly runs = new Map<string, IndexedRun>();
  private markCaughtUp!: () => void;
  /** Resolves once the watch has replayed every run stored when it began. */
  readonly caughtUp = new Promise<void>((resolve) => {
    this.markCaughtUp = resolve;
  });

  /** Notes a run's latest value (undefined: deleted). */
  observe(id: string, run: WorkflowRun | undefined): void {
    if (run) this.runs.set(id, { state: run.state, owner: ownerOf(run), workflow: run.workflow.name, order: `${run.createdAt} ${id}` });
    else this.runs.delete(id);
  }

  /** The replay of the runs stored when the watch began is over. */
  caughtUpNow(): void {
    this.markCaughtUp();
  }

  /**
   * The runs `matches` accepts, newest first, each with its place in that order (`order`, a
   * list's `next`), from just after the place `after` (if given).
   */
  newestFirst(matches: (run: IndexedRun) => boolean, after?: string): { id: string; order: string }[] {
    const found: { id: string; order: string }[] = [];
    for (const [id, run] of this.runs) {
      if ((after === undefined || run.order < after) && matches(run)) found.push({ id, order: run.order });
    }
    return found.sort((a, b) => (a.order < b.order ? 1 : a.order > b.order ? -1 : 0));
  }
}
