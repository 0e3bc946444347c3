import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { type ErasableBucket, eraseEntry, getJson, markErased, removeRevision } from "@boxcar/fabric/internal";
import {
  type CleanJobsReply,
  CleanJobsRequest,
  isTerminal,
  type JobRecord,
  type JobState,
  ownerOf,
  parseWith,
  WorkflowRun,
} from "@boxcar/protocol";
import { retentionOf } from "@boxcar/protocol/internal";
import type { IndexSnapshots } from "../jobs/index-snapshots.js";
import type { JobIndex } from "../jobs/job-index.js";
import type { PolicyBook } from "../limits/policy.js";
import { Sweep } from "../loops/sweep.js";
import { checkMayPurge, objectsOf, remainsOf, removeRemains } from "./remains.js";

/** Jobs deleted per batch (a `clean` request is one): a reply comes in time, a sweep takes batch after batch. */
const MAX_PER_BATCH = 500;
/** Deletions under way at once within a sweep. */
const PARALLEL = 8;
/**
 * How long a delete marker stays before it is purged: a watch shows a marker only if it reaches
 * it before the purge (JetStream skips a purged message unseen), and a dispatcher whose watch
 * missed one would count the deleted job for good. A later pass (sweep or clean) purges it.
 */
const MARKER_LINGER_MS = 30_000;
/** How long a job found gone may stay in the index, waiting for its delete marker, before it is taken out. */
const GHOST_MS = 10 * 60_000;

type KeptJob = NonNullable<CleanJobsReply["keptJobs"]>[number];

/** What one job's deletion came to. */
type Outcome = { outcome: "deleted" | "gone" } | { outcome: "kept"; kept: KeptJob };

/** When a job or run ended, and how. */
interface Ended {
  at: number;
  state: string;
}

/**
 * Deletes ended jobs once the system policy's retention has passed, whole: their events,
 * output, artifacts, input files, recorded model calls and checkpoint, then their record, last,
 * by compare-and-swap, so a dispatcher that dies midway leaves the job for the next sweep. Every
 * reason to keep a job (a file of its named by a job not yet ended) is found before anything of
 * it is removed, and nothing a deletion does needs room it has not just freed: every step but
 * the record's delete marker is a purge, which writes nothing, and on a full store the record's
 * own bytes are purged before its marker is written (the batch's markers once the whole batch
 * has freed room; one with no room yet at a later batch or sweep), so it works on a store filled
 * to its last byte. The markers themselves are purged by a later pass, once every dispatcher's
 * watch has had time to show them. Ended workflow runs likewise:
 * events, then record. It is shown every job record and every run by the dispatcher's watches
 * and keeps when each ended one ended. Several dispatchers may delete the same job; each step
 * is idempotent. The ended jobs, and when each ended, it reads from the job index.
 */
export class RetentionSweep {
  /**
   * Ended jobs this dispatcher found deleted (or deleted itself) that the index still has: passed
   * over until the watch shows the index their deletion.
   */
  private readonly gone = new Map<string, number>();
  /** Ended runs with no job still going. */
  private readonly endedRuns = new Map<string, Ended>();
  /** The jobs not yet ended that name each object, and the objects each such job names. */
  private readonly users = new Map<string, Set<string>>();
  private readonly openObjects = new Map<string, string[]>();
  /** Records deleted (purged) whose delete marker the store had no room for yet: written after the batch, or at a later one. */
  private readonly unmarked = new Map<string, { bucket: ErasableBucket; key: string }>();
  /**
   * Delete markers to remove, by bucket, key and sequence (this dispatcher's own, noted when it
   * writes them and again when its watch shows them, are kept once), each removed by a pass at
   * least `markerLingerMs` after it was first noted.
   */
  private readonly lingering = new Map<string, { bucket: ErasableBucket; key: string; marker: number; at: number }>();
  private readonly sweeps: Sweep<number>;

  /** Sweeps every `intervalMs` once started. */
  constructor(
    private readonly topology: Topology,
    private readonly policy: PolicyBook,
    private readonly log: Logger,
    intervalMs: number,
    private readonly index: JobIndex,
    /** Up to which sequence the job index's snapshots cover the jobs bucket: its delete markers are kept until then. */
    private readonly snapshots: Pick<IndexSnapshots, "coveredSeq">,
    /** How long a delete marker lingers, and a job found gone waits for its marker (tests shorten them). */
    private readonly waits: { markerLingerMs: number; ghostMs: number } = { markerLingerMs: MARKER_LINGER_MS, ghostMs: GHOST_MS },
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
      const users = this.users.get(object);
      users?.delete(key);
      if (users?.size === 0) this.users.delete(object);
    }
    this.openObjects.delete(key);
    this.gone.delete(key);
    if (!job || isTerminal(job.state)) return;
    const objects = objectsOf(job);
    if (objects.length === 0) return;
    this.openObjects.set(key, objects);
    for (const object of objects) {
      const users = this.users.get(object) ?? new Set<string>();
      users.add(key);
      this.users.set(object, users);
    }
  }

  /** Notes a run's latest value (undefined: deleted); `ended`: it is final and none of its jobs is going. */
  observeRun(key: string, run: WorkflowRun | undefined, ended: boolean): void {
    if (run && ended) this.endedRuns.set(key, { at: Date.parse(run.finishedAt ?? run.createdAt), state: run.state });
    else this.endedRuns.delete(key);
  }

  private async sweepOnce(): Promise<number> {
    const now = Date.now();
    const policy = this.policy.policy;
    await this.writeOwedMarkers();
    await this.purgeLingeringMarkers();
    await this.forgetGhosts(now);
    let deleted = 0;
    // Batch after batch while there is more due: a sweep keeps up with any rate jobs end at
    // that one dispatcher can delete them.
    // A job kept (its files in use, or it failed) is passed over for the rest of the sweep, so
    // a batch of kept jobs cannot hold back the ones due behind it.
    const passed = new Set<string>();
    const kept: KeptJob[] = [];
    for (let more = true; more && !this.closed; ) {
      const batch = await this.deleteMatching(({ at, state, agent }) => at + retentionOf(policy, state, agent) <= now, passed);
      deleted += batch.deleted;
      kept.push(...(batch.keptJobs ?? []));
      more = batch.more;
    }
    const runs = await this.deleteRuns((run) => run.at + retentionOf(policy, run.state) <= now);
    if (deleted > 0 || runs > 0) this.log.info({ deleted, runs }, "deleted jobs and workflow runs past their retention");
    const errors = kept.filter((k) => k.reason === "error");
    if (errors.length > 0) {
      this.log.warn({ jobs: errors.length, first: errors[0] }, "could not delete some ended jobs; trying again at the next sweep");
    }
    return deleted;
  }

  /** Deletes now the ended jobs that match, as retention would (`boxcar clean`), up to a bound; says why each job it kept was kept. */
  async clean(request: CleanJobsRequest): Promise<CleanJobsReply> {
    const { olderThan, state, agent } = parseWith(CleanJobsRequest, request, "request");
    const before = Date.now() - olderThan;
    await this.writeOwedMarkers();
    await this.purgeLingeringMarkers();
    const result = await this.deleteMatching(
      (job) => job.at <= before && (state === undefined || job.state === state) && (agent === undefined || job.agent === agent),
    );
    const reasons: Record<string, number> = {};
    for (const k of result.keptJobs ?? []) reasons[k.reason] = (reasons[k.reason] ?? 0) + 1;
    this.log.info(
      { olderThanMs: olderThan, state, agent, deleted: result.deleted, kept: reasons, more: result.more },
      "jobs cleaned by request",
    );
    return result;
  }

  /** Deletes a batch of the ended jobs that match; a job kept is added to `passed`, which a batch skips. */
  private async deleteMatching(
    matches: (job: { at: number; state: JobState; agent: string }) => boolean,
    passed = new Set<string>(),
  ): Promise<CleanJobsReply> {
    const due: string[] = [];
    let more = false;
    for (const [id, job] of this.index.ended()) {
      if (passed.has(id) || this.gone.has(id) || !matches({ at: job.endedAt, state: job.state, agent: job.agent })) continue;
      if (due.length === MAX_PER_BATCH) {
        more = true;
        break;
      }
      due.push(id);
    }
    let deleted = 0;
    const keptJobs: KeptJob[] = [];
    const keep = (kept: KeptJob) => {
      keptJobs.push(kept);
      passed.add(kept.id);
    };
    // Refused here, a dispatcher whose credential may not purge keeps every job whole.
    const refused =
      due.length === 0
        ? undefined
        : await checkMayPurge(this.topology).then(
            () => undefined,
            (err: unknown) => err as Error,
          );
    for (let i = 0; i < due.length && !this.closed; i += PARALLEL) {
      await Promise.all(
        due.slice(i, i + PARALLEL).map(async (id) => {
          if (refused) {
            keep({
              id,
              reason: "error",
              message: `nothing of it was removed: JetStream did not let this dispatcher purge (${refused.message})`,
            });
            return;
          }
          const done = await this.deleteJob(id);
          if (done.outcome === "deleted") deleted += 1;
          if (done.outcome === "kept") keep(done.kept);
        }),
      );
    }
    // The markers the store had no room for, once the whole batch has freed what it could: a
    // store filled past its limit (JetStream lets the last write it takes pass it) refuses every
    // write until enough is freed, more than one record's bytes may be.
    if (this.unmarked.size > 0) await this.writeOwedMarkers();
    return { deleted, kept: keptJobs.length, ...(keptJobs.length > 0 ? { keptJobs } : {}), more };
  }

  /**
   * Deletes one ended job, whole or not at all: every reason to keep it is found before anything
   * of it goes; then the rest, then its record (compare-and-swap). A deletion cut short (NATS out
   * of reach) leaves the record, so the job is found again and finished at the next sweep.
   */
  private async deleteJob(id: string): Promise<Outcome> {
    const { topology } = this;
    let removing = false;
    try {
      const found = await topology.jobStore.read(id);
      if (!found || !isTerminal(found.record.state)) {
        this.goneFromIndex(id);
        return { outcome: "gone" };
      }
      const job = found.record;
      const inUse = this.inUse(job);
      if (inUse) return { outcome: "kept", kept: inUse };
      removing = true;
      await removeRemains(topology, id, remainsOf(job));
      const erased = await eraseEntry(topology, "jobs", id, found.revision);
      if (erased.outcome === "changed") {
        const now = await topology.jobStore.read(id).catch(() => null);
        const what = now ? `it is ${now.record.state} now${now.record.state === "queued" ? " (retried)" : ""}` : "it is gone now";
        const message = `its record changed while it was being deleted (${what}): the record stays, its events, output and files had gone`;
        return { outcome: "kept", kept: { id, reason: "changed", message } };
      }
      this.goneFromIndex(id);
      if (erased.outcome === "unmarked") this.unmarked.set(`jobs/${id}`, { bucket: "jobs", key: id });
      // Its marker goes too, later (this one's, by its sequence; another deletion's marker, that one purges).
      if (erased.outcome === "erased" && erased.marker !== undefined) this.linger("jobs", id, erased.marker);
      return { outcome: "deleted" };
    } catch (err) {
      const message = removing
        ? `its deletion was cut short (${(err as Error).message}): what is left of it, its record included, is deleted at the next sweep`
        : `nothing of it was removed: ${(err as Error).message}`;
      return { outcome: "kept", kept: { id, reason: "error", message } };
    }
  }

  /**
   * Takes out of the index the jobs found gone `ghostMs` ago that it still has: their deletion's
   * marker never came. That is a record purged on a full store whose dispatcher died before it
   * could write the marker, or a deletion a start from a snapshot missed (an older dispatcher
   * removing markers that no snapshot covers).
   */
  private async forgetGhosts(now: number): Promise<void> {
    const ghosts: string[] = [];
    for (const [id, since] of this.gone) {
      if (now - since < this.waits.ghostMs || this.closed) continue;
      if (this.index.has(id) && !(await this.topology.jobStore.read(id))) {
        ghosts.push(id);
        this.index.observe(id, undefined);
      }
      this.gone.delete(id);
    }
    if (ghosts.length > 0)
      this.log.warn({ jobs: ghosts.length, first: ghosts[0] }, "forgot jobs whose records are gone though no delete marker of theirs came");
  }

  /** Passes over `id`, deleted (or no longer ended), until the index has that from the watch. */
  private goneFromIndex(id: string): void {
    // Not there (the watch came first): nothing to wait for.
    if (this.index.isEnded(id) && !this.gone.has(id)) this.gone.set(id, Date.now());
  }

  /**
   * Why `job` must be kept: a file of its is named by a job not yet ended (an input given to
   * several jobs, files a handoff carried), which would lose it.
   */
  private inUse(job: JobRecord): KeptJob | undefined {
    for (const object of new Set(objectsOf(job))) {
      const users = [...(this.users.get(object) ?? [])].filter((user) => user !== job.id);
      if (users.length === 0) continue;
      const kind = job.spec?.files.some((f) => f.object === object) ? "input file" : "artifact";
      const others = users.length > 1 ? ` (and ${users.length - 1} more)` : "";
      return {
        id: job.id,
        reason: "file_in_use",
        message: `its ${kind} ${object} is also an input of job ${users[0]}${others}, which has not ended: it is deleted once that job has ended`,
      };
    }
    return undefined;
  }

  /**
   * Writes the delete markers the store had no room for (their records are gone: reads find
   * nothing, but watchers still count them), and purges each once written.
   */
  private async writeOwedMarkers(): Promise<void> {
    for (const [owed, { bucket, key }] of this.unmarked) {
      if (this.closed) return;
      try {
        const marked = await markErased(this.topology, bucket, key);
        if (marked.outcome === "unmarked") continue; // still no room
        this.unmarked.delete(owed);
        if (marked.outcome === "erased" && marked.marker !== undefined) this.linger(bucket, key, marked.marker);
      } catch (err) {
        this.log.warn({ err, bucket, key }, "could not write a deleted record's marker; trying again at the next sweep");
      }
    }
  }

  /** Keeps a delete marker for `markerLingerMs` from now, long enough for every dispatcher's watch to show it, then removes it. */
  private linger(bucket: ErasableBucket, key: string, marker: number): void {
    const id = `${bucket} ${key} ${marker}`;
    if (!this.lingering.has(id)) this.lingering.set(id, { bucket, key, marker, at: Date.now() });
  }

  /**
   * Notes a delete marker the watch showed (`revision`, its sequence): one this dispatcher did
   * not write (another's, whose own removal a stop cut short; a submit taken back) goes the same
   * way as its own, once it has lingered.
   */
  observeMarker(bucket: ErasableBucket, key: string, revision: number): void {
    this.linger(bucket, key, revision);
  }

  /** The delete markers of `bucket` still to remove, each key and sequence (a snapshot of the job index keeps them). */
  markersOf(bucket: ErasableBucket): [string, number][] {
    return [...this.lingering.values()].filter((m) => m.bucket === bucket).map((m) => [m.key, m.marker]);
  }

  /**
   * Removes the delete markers that have lingered long enough (a later message of the key, a
   * record written again, stays): a jobs bucket's once a snapshot of the job index covers it too,
   * since a dispatcher that starts from that snapshot sees the deletion only by its marker.
   */
  private async purgeLingeringMarkers(): Promise<void> {
    const due = Date.now() - this.waits.markerLingerMs;
    const covered = [...this.lingering.values()].some((m) => m.at <= due && m.bucket === "jobs")
      ? await this.snapshots.coveredSeq().catch((err: unknown) => {
          this.log.warn({ err }, "could not read the job index's snapshots; the jobs bucket's delete markers stay for now");
          return 0;
        })
      : 0;
    // Taken off the list before the first wait: a clean and a sweep may run this at once.
    const batch = [...this.lingering].filter(([, m]) => m.at <= due && (m.bucket !== "jobs" || m.marker <= covered));
    for (const [id] of batch) this.lingering.delete(id);
    for (const [i, [, { bucket, key, marker }]] of batch.entries()) {
      try {
        if (this.closed) throw new Error("stopped");
        await removeRevision(this.topology, bucket, key, marker);
      } catch (err) {
        // The rest wait for the next pass.
        for (const [id, m] of batch.slice(i)) this.lingering.set(id, m);
        if (!this.closed) this.log.warn({ err, bucket, key }, "could not remove a deleted record's marker; trying again at the next sweep");
        return;
      }
    }
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
    if (this.unmarked.size > 0) await this.writeOwedMarkers();
    return deleted;
  }

  /** Deletes one ended run as it was read (compare-and-swap), as a job: its events, then its record. */
  private async deleteRun(id: string): Promise<boolean> {
    const { topology } = this;
    const found = await getJson(topology.workflows, id, WorkflowRun, "workflow run");
    if (!found) {
      this.endedRuns.delete(id);
      return false;
    }
    const { names } = topology;
    await topology.jsm.streams.purge(names.streams.events, { filter: names.subjects.runEvents(ownerOf(found.value), id) });
    const erased = await eraseEntry(topology, "workflows", id, found.revision);
    if (erased.outcome === "changed") return false; // changed meanwhile: the watch says what it is now
    this.endedRuns.delete(id);
    if (erased.outcome === "unmarked") this.unmarked.set(`workflows/${id}`, { bucket: "workflows", key: id });
    if (erased.outcome === "erased" && erased.marker !== undefined) this.linger("workflows", id, erased.marker);
    return true;
  }
}
