import { ownerOf, type WorkflowRun } from "@boxcar/protocol";

/** What a list filters a run on. */
export interface RunFacts {
  state: string;
  owner: string;
  workflow: string;
  /** Who may decide one of its approval steps that waits now (its approvers, or its owner); none waiting: empty. */
  deciders: string[];
}

/** What the index keeps of a run: what `workflows.list` filters on, and where it sorts. */
interface IndexedRun extends RunFacts {
  /** Where it sorts: its creation time, then its id (a run started with a key has a hashed id). */
  order: string;
}

/** What a list filters `run` on. */
export function factsOf(run: WorkflowRun): RunFacts {
  const owner = ownerOf(run);
  const deciders = run.workflow.steps.flatMap(({ name, approval }) => {
    const state = run.steps[name];
    if (!approval || state?.state !== "running" || !state.approval || state.approval.decision !== undefined) return [];
    return approval.approvers.length > 0 ? approval.approvers : [owner];
  });
  return { state: run.state, owner, workflow: run.workflow.name, deciders };
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
    if (run) this.runs.set(id, { ...factsOf(run), order: `${run.createdAt} ${id}` });
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
  newestFirst(matches: (run: RunFacts) => boolean, after?: string): { id: string; order: string }[] {
    const found: { id: string; order: string }[] = [];
    for (const [id, run] of this.runs) {
      if ((after === undefined || run.order < after) && matches(run)) found.push({ id, order: run.order });
    }
    return found.sort((a, b) => (a.order < b.order ? 1 : a.order > b.order ? -1 : 0));
  }
}
