import type { Logger } from "@boxcar/common";
import { getJson, isRevisionConflict, removeObject, type Topology } from "@boxcar/fabric";
import {
  type CleanJobsReply,
  CleanJobsRequest,
  harnessObjects,
  isTerminal,
  type JobRecord,
  type JobState,
  ownerOf,
  parseWith,
  recordedCallObject,
  retentionOf,
  WorkflowRun,
} from "@boxcar/protocol";
import type { PolicyBook } from "../limits/policy.js";
import { Sweep } from "../loops/sweep.js";

/** Jobs deleted per batch (a `clean` request is one): a reply comes in time, a sweep takes batch after batch. */
const MAX_PER_BATCH = 500;
/** Deletions under way at once within a sweep. */
const PARALLEL = 8;

/** What a job's deletion removes besides its record: the objects it names. */
const objectsOf = (job: JobRecord): string[] => [...(job.spec?.files ?? []).map((f) => f.object), ...job.artifacts.map((a) => a.object)];

/** When a job or run ended, and how. */
interface Ended {
  at: number;
  state: string;
}

/**
 * Deletes ended jobs once the system policy's retention has passed: each job's events, output,
 * artifacts and input files, then its record (compare-and-swap, so a job retried meanwhile stays).
 * Ended workflow runs likewise: their events, then their record. It is shown every job record
 * and every run by the dispatcher's watches and keeps when each ended one ended.
 * Several dispatchers may delete the same job; each step is idempotent, and the record goes
 * last, so a dispatcher that dies midway leaves the job for the next sweep. An object that a job
 * not yet ended also names (a handoff's carried files, an input given to several jobs) keeps its
 * jobs until that job has ended.
 */
export class RetentionSweep {
  /** Ended jobs: when each ended, how, and its agent. */
  private readonly ended = new Map<string, Ended & { state: JobState; agent: string }>();
  /** Ended runs with no job still going. */
  private readonly endedRuns = new Map<string, Ended>();
  /** How many jobs not yet ended name each object, and the objects of each. */
  private readonly inUse = new Map<string, number>();
  private readonly openObjects = new Map<string, string[]>();
  private readonly sweeps: Sweep<number>;

  /** Sweeps every `intervalMs` once started. */
  constructor(
    private readonly topology: Topology,
    private readonly policy: PolicyBook,
    private readonly log: Logger,
    intervalMs: number,
  ) {
    this.sweeps = new Sweep({
      pass: () => this.sweepOnce(),
      intervalMs,
      onError: (err) => log.warn({ err }, "could not delete the jobs and workflow runs past their retention"),
    });
  }

  start(): void {
    this.sweeps.start();
  }

  /** Deletes now the ended jobs and runs past their retention (or joins the sweep under way); resolves with how many jobs went. */
  run(): Promise<number> {
    return this.sweeps.run();
  }

  /** Stops sweeping; a sweep under way ends after the deletions in flight. */
  stop(): Promise<void> {
    return this.sweeps.stop();
  }

  /** True once stopped: a sweep, or a `clean`, starts no more deletions. */
  private get closed(): boolean {
    return this.sweeps.stopped;
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
      this.ended.set(key, { at: Date.parse(job.finishedAt ?? job.createdAt), state: job.state, agent: job.agent });
      return;
    }
    const objects = objectsOf(job);
    if (objects.length === 0) return;
    this.openObjects.set(key, objects);
    for (const object of objects) this.inUse.set(object, (this.inUse.get(object) ?? 0) + 1);
  }

  /** Notes a run's latest value (undefined: deleted); `ended`: it is final and none of its jobs is going. */
  observeRun(key: string, run: WorkflowRun | undefined, ended: boolean): void {
    if (run && ended) this.endedRuns.set(key, { at: Date.parse(run.finishedAt ?? run.createdAt), state: run.state });
    else this.endedRuns.delete(key);
  }

  private async sweepOnce(): Promise<number> {
    const now = Date.now();
    const policy = this.policy.policy;
    let deleted = 0;
    // Batch after batch while there is more due: a sweep keeps up with any rate jobs end at
    // that one dispatcher can delete them.
    // A job kept (its files in use, or it failed) is passed over for the rest of the sweep, so
    // a batch of kept jobs cannot hold back the ones due behind it.
    const passed = new Set<string>();
    for (let more = true; more && !this.closed; ) {
      const batch = await this.deleteMatching(({ at, state, agent }) => at + retentionOf(policy, state, agent) <= now, passed);
      deleted += batch.deleted;
      more = batch.more;
    }
    const runs = await this.deleteRuns((run) => run.at + retentionOf(policy, run.state) <= now);
    if (deleted > 0 || runs > 0) this.log.info({ deleted, runs }, "deleted jobs and workflow runs past their retention");
    return deleted;
  }

  /** Deletes now the ended jobs that match, as retention would (`boxcar clean`), up to a bound. */
  async clean(request: CleanJobsRequest): Promise<CleanJobsReply> {
    const { olderThan, state, agent } = parseWith(CleanJobsRequest, request, "request");
    const before = Date.now() - olderThan;
    const result = await this.deleteMatching(
      (job) => job.at <= before && (state === undefined || job.state === state) && (agent === undefined || job.agent === agent),
    );
    this.log.info({ olderThanMs: olderThan, state, agent, ...result }, "jobs cleaned by request");
    return result;
  }

  /** Deletes a batch of the ended jobs that match; a job kept is added to `passed`, which a batch skips. */
  private async deleteMatching(
    matches: (job: { at: number; state: JobState; agent: string }) => boolean,
    passed = new Set<string>(),
  ): Promise<CleanJobsReply> {
    const due: string[] = [];
    let more = false;
    for (const [id, job] of this.ended) {
      if (passed.has(id) || !matches(job)) continue;
      if (due.length === MAX_PER_BATCH) {
        more = true;
        break;
      }
      due.push(id);
    }
    let deleted = 0;
    let kept = 0;
    for (let i = 0; i < due.length && !this.closed; i += PARALLEL) {
      await Promise.all(
        due.slice(i, i + PARALLEL).map(async (id) => {
          try {
            const outcome = await this.deleteJob(id);
            if (outcome === "deleted") deleted += 1;
            if (outcome === "kept") {
              kept += 1;
              passed.add(id);
            }
          } catch (err) {
            kept += 1;
            passed.add(id);
            this.log.warn({ err, jobId: id }, "could not delete an ended job; trying again at the next sweep");
          }
        }),
      );
    }
    return { deleted, kept, more };
  }

  /** Deletes one ended job and what belongs to it; "kept" when an object is still in use or it changed meanwhile. */
  private async deleteJob(id: string): Promise<"deleted" | "kept" | "gone"> {
    const { topology } = this;
    const found = await topology.jobStore.read(id);
    if (!found || !isTerminal(found.record.state)) {
      this.ended.delete(id);
      return "gone";
    }
    const job = found.record;
    const objects = objectsOf(job);
    if (objects.some((o) => this.inUse.has(o))) return "kept"; // a job not yet ended needs them: later
    const { names } = topology;
    // The purges first: a dispatcher whose credential predates them is refused before it has
    // removed anything.
    await topology.jsm.streams.purge(names.streams.events, { filter: names.subjects.jobEvents(ownerOf(job), id) });
    await topology.jsm.streams.purge(names.streams.logs, { filter: names.subjects.jobLogs(ownerOf(job), id) });
    for (const object of new Set(objects)) await removeObject(topology, object);
    await removeRecordedCalls(topology, job);
    await removeCheckpoint(topology, job.id);
    if (!(await topology.jobStore.remove(found))) return "kept"; // changed meanwhile (retried)
    this.ended.delete(id);
    return "deleted";
  }

  /** Deletes every ended run that `due` says is due, a few at a time; resolves with how many went. */
  private async deleteRuns(due: (run: Ended) => boolean): Promise<number> {
    const ids = [...this.endedRuns].filter(([, run]) => due(run)).map(([id]) => id);
    let deleted = 0;
    for (let i = 0; i < ids.length && !this.closed; i += PARALLEL) {
      await Promise.all(
        ids.slice(i, i + PARALLEL).map(async (id) => {
          try {
            if (await this.deleteRun(id)) deleted += 1;
          } catch (err) {
            this.log.warn({ err, runId: id }, "could not delete an ended workflow run; trying again at the next sweep");
          }
        }),
      );
    }
    return deleted;
  }

  /** Deletes one ended run: its events, then its record, as it was read (compare-and-swap). */
  private async deleteRun(id: string): Promise<boolean> {
    const { topology } = this;
    const found = await getJson(topology.workflows, id, WorkflowRun, "workflow run");
    if (!found) {
      this.endedRuns.delete(id);
      return false;
    }
    const { names } = topology;
    await topology.jsm.streams.purge(names.streams.events, { filter: names.subjects.runEvents(ownerOf(found.value), id) });
    try {
      await topology.workflows.delete(id, { previousSeq: found.revision });
    } catch (err) {
      if (isRevisionConflict(err)) return false; // changed meanwhile: the watch says what it is now
      throw err;
    }
    await topology.purgeKey("workflows", id);
    this.endedRuns.delete(id);
    return true;
  }
}

/** Removes a prompt agent's checkpoint (docs/harness.md#durable-steps): its loop's state, and its workspace if kept. */
async function removeCheckpoint(topology: Topology, jobId: string): Promise<void> {
  const { state, workspace } = harnessObjects(jobId);
  const info = await topology.artifacts.info(state);
  if (!info || info.deleted) return;
  await removeObject(topology, workspace);
  await removeObject(topology, state);
}

/**
 * Removes the job's recorded model calls (`models.record`), one object per place in its
 * attempts' sequence: at most as many as the calls it made, and any past those still found.
 */
async function removeRecordedCalls(topology: Topology, job: JobRecord): Promise<void> {
  const made = job.usage?.calls ?? 0;
  for (let position = 1; ; position++) {
    const name = recordedCallObject(job.id, position);
    const info = await topology.artifacts.info(name);
    if (info && !info.deleted) await removeObject(topology, name);
    else if (position > made) return;
  }
}
