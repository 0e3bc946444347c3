import type { Logger } from "@boxcar/client";
import { removeObject, type Topology } from "@boxcar/fabric";
import { isTerminal, type JobRecord, type JobState, ownerOf, retentionOf } from "@boxcar/protocol";
import type { PolicyBook } from "./policy.js";

/** Jobs deleted per sweep at most: a backlog (a shorter retention just set) is worked off over several. */
const MAX_PER_SWEEP = 500;
/** Deletions under way at once within a sweep. */
const PARALLEL = 8;

/** What a job's deletion removes besides its record: the objects it names. */
const objectsOf = (job: JobRecord): string[] => [...(job.spec?.files ?? []).map((f) => f.object), ...job.artifacts.map((a) => a.object)];

/**
 * Deletes ended jobs once the system policy's retention has passed: each job's artifacts, input
 * files, events and output, then its record (compare-and-swap, so a job retried meanwhile stays).
 * It is shown every job record by the dispatcher's watch and keeps when each ended job ended.
 * Several dispatchers may delete the same job; each step is idempotent, and the record goes
 * last, so a dispatcher that dies midway leaves the job for the next sweep. An object that a job
 * not yet ended also names (a handoff's carried files, an input given to several jobs) keeps its
 * jobs until that job has ended.
 */
export class RetentionSweeper {
  /** Ended jobs: when each ended, and how. */
  private readonly ended = new Map<string, { at: number; state: JobState }>();
  /** How many jobs not yet ended name each object, and the objects of each. */
  private readonly inUse = new Map<string, number>();
  private readonly openObjects = new Map<string, string[]>();
  private readonly timer: NodeJS.Timeout;
  private sweeping: Promise<number> | undefined;
  private closed = false;

  constructor(
    private readonly topology: Topology,
    private readonly policy: PolicyBook,
    private readonly log: Logger,
    intervalMs: number,
  ) {
    this.timer = setInterval(() => void this.sweep(), intervalMs);
  }

  /** Notes a job record's latest value (undefined: the record was deleted). */
  observe(key: string, job: JobRecord | undefined): void {
    for (const object of this.openObjects.get(key) ?? []) {
      const n = (this.inUse.get(object) ?? 1) - 1;
      if (n > 0) this.inUse.set(object, n);
      else this.inUse.delete(object);
    }
    this.openObjects.delete(key);
    this.ended.delete(key);
    if (!job) return;
    if (isTerminal(job.state)) {
      this.ended.set(key, { at: Date.parse(job.finishedAt ?? job.createdAt), state: job.state });
      return;
    }
    const objects = objectsOf(job);
    if (objects.length === 0) return;
    this.openObjects.set(key, objects);
    for (const object of objects) this.inUse.set(object, (this.inUse.get(object) ?? 0) + 1);
  }

  /** Deletes the ended jobs past their retention, up to a bound; resolves with how many went. */
  sweep(now = Date.now()): Promise<number> {
    this.sweeping ??= this.deleteDue(now).finally(() => {
      this.sweeping = undefined;
    });
    return this.sweeping;
  }

  private async deleteDue(now: number): Promise<number> {
    const policy = this.policy.policy;
    const due: string[] = [];
    for (const [id, { at, state }] of this.ended) {
      if (at + retentionOf(policy, state) <= now) due.push(id);
      if (due.length === MAX_PER_SWEEP) break;
    }
    let deleted = 0;
    for (let i = 0; i < due.length && !this.closed; i += PARALLEL) {
      await Promise.all(
        due.slice(i, i + PARALLEL).map(async (id) => {
          try {
            if (await this.deleteJob(id)) deleted += 1;
          } catch (err) {
            this.log.warn({ err, jobId: id }, "could not delete a job past its retention; trying again at the next sweep");
          }
        }),
      );
    }
    if (deleted > 0) this.log.info({ deleted, due: due.length }, "deleted jobs past their retention");
    return deleted;
  }

  /** Deletes one ended job and what belongs to it; false when it is kept (gone, changed, or an object still in use). */
  private async deleteJob(id: string): Promise<boolean> {
    const { topology } = this;
    const found = await topology.jobStore.read(id);
    if (!found || !isTerminal(found.record.state)) {
      this.ended.delete(id);
      return false;
    }
    const job = found.record;
    const objects = objectsOf(job);
    if (objects.some((o) => this.inUse.has(o))) return false; // a job not yet ended needs them: later
    const { names } = topology;
    for (const object of new Set(objects)) await removeObject(topology, object);
    await topology.jsm.streams.purge(names.streams.events, { filter: names.subjects.jobEvents(ownerOf(job), id) });
    await topology.jsm.streams.purge(names.streams.logs, { filter: names.subjects.jobLogs(ownerOf(job), id) });
    if (!(await topology.jobStore.remove(found))) return false; // changed meanwhile (retried): kept
    this.ended.delete(id);
    return true;
  }

  /** Stops sweeping; a sweep under way ends after the deletions in flight. */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.timer);
    await this.sweeping;
  }
}
