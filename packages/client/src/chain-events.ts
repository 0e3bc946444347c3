import { setTimeout as delay } from "node:timers/promises";
import { jsonOf } from "@boxcar/common";
import {
  BoxcarError,
  BoxcarEvent,
  ErrorCode,
  handoffPending,
  isRunFinal,
  isTerminal,
  type JobRecord,
  type Names,
  ownerOf,
  type WorkflowRun as Run,
} from "@boxcar/protocol";
import type { Msg, NatsConnection } from "@nats-io/transport-node";
import { type FollowOptions, followPages, type HistoryPage, RECHECK_MS, Wake } from "./follow.js";

/** How a client reaches a Boxcar system: one NATS connection and the system's names. */
export interface ClientLink {
  readonly nc: NatsConnection;
  readonly names: Names;
}

/**
 * How a client reads records and history: through the dispatchers' API, which checks that the
 * caller may see them. Waiting and following never touch JetStream, which a submitter's
 * credential may not.
 */
export interface HistoryReader {
  getJob(id: string): Promise<JobRecord>;
  getRun(id: string): Promise<Run>;
  jobEventsPage(id: string, after: number): Promise<HistoryPage<BoxcarEvent>>;
  runEventsPage(id: string, after: number): Promise<HistoryPage<BoxcarEvent>>;
}

const eventOf = (msg: Msg): BoxcarEvent | undefined => {
  const parsed = BoxcarEvent.safeParse(jsonOf(msg));
  return parsed.success ? parsed.data : undefined;
};

/**
 * Waits until `done` holds for the record: `first` as the caller read it (if it did), else read
 * again after every live event on `live` that `matters`, and every few seconds in any case
 * (events are not stored when their publish fails; records are).
 */
async function waitUntil<T>(
  link: ClientLink,
  live: readonly string[],
  first: T | undefined,
  read: () => Promise<T>,
  done: (value: T) => boolean,
  matters: (event: BoxcarEvent) => boolean,
  signal?: AbortSignal,
): Promise<T> {
  if (first !== undefined && done(first)) return first; // no subscription needed
  using wake = await Wake.open(link.nc, live, (msg) => {
    const event = eventOf(msg);
    return event !== undefined && matters(event);
  });
  // Read again now that the subscription stands: the record may have changed in between.
  for (;;) {
    const value = await ridingOut(read, () => wake.wait(RECHECK_MS, signal), signal);
    if (done(value)) return value;
    if (signal?.aborted) throw new BoxcarError(ErrorCode.cancelled, "stopped waiting");
    await wake.wait(RECHECK_MS, signal);
  }
}

/**
 * `read`, asked again after each `pause` while no dispatcher answers (one restarting, a cluster
 * electing leaders): the job or run goes on without them. Gives up after `RIDE_OUT_MS`.
 */
async function ridingOut<T>(read: () => Promise<T>, pause: () => Promise<unknown>, signal?: AbortSignal): Promise<T> {
  let unanswered: number | undefined;
  for (;;) {
    try {
      return await read();
    } catch (err) {
      if (!(err instanceof BoxcarError && err.code === ErrorCode.unavailable)) throw err;
      unanswered ??= Date.now();
      if (Date.now() - unanswered > RIDE_OUT_MS) throw err;
      if (signal?.aborted) throw new BoxcarError(ErrorCode.cancelled, "stopped waiting");
      await pause();
      if (signal?.aborted) throw new BoxcarError(ErrorCode.cancelled, "stopped waiting");
    }
  }
}

/** `ridingOut` for a wait's first read, before it knows what to listen to: it pauses `RECHECK_MS` between asks. */
const firstRead = <T>(read: () => Promise<T>, signal?: AbortSignal): Promise<T> =>
  ridingOut(read, () => delay(RECHECK_MS, undefined, { signal }).catch(() => undefined), signal);

/** How long waiting for a job or run rides out dispatchers that do not answer before it gives up. */
const RIDE_OUT_MS = 60_000;

/** The live subjects of a job's own events (`job` kind), and of all its events. */
export const jobEventSubjects = (names: Names, owner: string, jobId: string) => names.subjects.event("job", jobId, "*", owner);
const allJobEventSubjects = (names: Names, owner: string, jobId: string): string[] => [
  jobEventSubjects(names, owner, jobId),
  names.subjects.event("sandbox", jobId, "*", owner),
];

/**
 * A job's record once `done` holds for it. `owner` names whose events to listen to: the job's
 * owner, or `*` (for a caller who may see everyone's) when the record is not read yet.
 */
export function waitForJobRecord(
  link: ClientLink,
  reader: HistoryReader,
  job: { id: string; owner: string; record?: JobRecord },
  done: (job: JobRecord) => boolean,
  signal?: AbortSignal,
): Promise<JobRecord> {
  return waitUntil(
    link,
    [jobEventSubjects(link.names, job.owner, job.id)],
    job.record,
    () => reader.getJob(job.id),
    done,
    (e) => e.kind === "job" && isTerminal(e.state),
    signal,
  );
}

/** The last job of the chain `jobId` starts, once it has ended (its handoff, if any, decided and followed). */
export async function waitForChainEnd(link: ClientLink, reader: HistoryReader, jobId: string, signal?: AbortSignal): Promise<JobRecord> {
  for (let id = jobId; ; ) {
    const record = await firstRead(() => reader.getJob(id), signal);
    const job = await waitForJobRecord(
      link,
      reader,
      { id, owner: ownerOf(record), record },
      (j) => isTerminal(j.state) && !handoffPending(j),
      signal,
    );
    if (!job.handoff?.jobId) return job;
    id = job.handoff.jobId;
  }
}

/** A run once it has ended and none of its jobs is still going. */
export async function waitForRunEnd(link: ClientLink, reader: HistoryReader, runId: string, signal?: AbortSignal): Promise<Run> {
  const run = await firstRead(() => reader.getRun(runId), signal);
  const owner = ownerOf(run);
  // The run's events and its jobs' final events, all under its owner.
  return waitUntil(
    link,
    [link.names.subjects.runEvents(owner, runId), link.names.subjects.ownerEventsOf("job", owner)],
    run,
    () => reader.getRun(runId),
    (r) => isRunFinal(r.state) && !hasJobsGoing(r),
    (e) => (e.kind === "workflow" && e.runId === runId) || (e.kind === "job" && e.run === runId && isTerminal(e.state)),
    signal,
  );
}

const hasJobsGoing = (run: Run): boolean =>
  Object.values(run.steps).some((s) => s.instances.some((i) => i.state === "running" || i.state === "starting"));

/** A job's events, oldest first; with `follow`, until its final event. */
export function followJob(link: ClientLink, reader: HistoryReader, job: JobRecord, opts: FollowOptions = {}): AsyncGenerator<BoxcarEvent> {
  return followPages(link.nc, (after) => reader.jobEventsPage(job.id, after), {
    ...opts,
    live: allJobEventSubjects(link.names, ownerOf(job), job.id),
    done: (event) => event.kind === "job" && isTerminal(event.state),
  });
}

/**
 * The events of a job and of the jobs it hands off to, one job after the other. With `follow`
 * it waits for each job's handoff decision and ends with the chain's last job.
 */
export async function* followChain(
  link: ClientLink,
  reader: HistoryReader,
  first: JobRecord,
  opts: FollowOptions = {},
): AsyncGenerator<BoxcarEvent> {
  const owner = ownerOf(first); // every job of a chain belongs to its first job's owner
  for (let id: string | undefined = first.id; id !== undefined; ) {
    const current: string = id;
    id = undefined;
    const events = followPages(link.nc, (after) => reader.jobEventsPage(current, after), {
      ...opts,
      live: allJobEventSubjects(link.names, owner, current),
    });
    for await (const event of events) {
      yield event;
      if (event.kind !== "job") continue;
      if (event.type === "handoff") {
        id = event.next;
        break;
      }
      if (!opts.follow) continue;
      if (event.type === "handoff_refused") break;
      if (isTerminal(event.state)) {
        // Only a succeeded job's handoff is decided: wait for the decision, else the chain ends here.
        const record = await reader.getJob(current);
        if (!(handoffPending(record) || record.handoff)) break;
      }
    }
  }
}

/** How long after a run's end its follow waits for a job's final event that its record says came. */
const LOST_EVENT_GRACE_MS = 5_000;

/**
 * A run's events and the events of its jobs (and their sandboxes), in the order they were
 * stored. With `follow`, until the run has ended and none of its jobs is still going: the jobs
 * a failed or cancelled run stops end after the run's own final event.
 */
export function followRun(link: ClientLink, reader: HistoryReader, run: Run, opts: FollowOptions = {}): AsyncGenerator<BoxcarEvent> {
  const owner = ownerOf(run);
  const going = new Set<string>();
  let endedAt: number | undefined;
  return followPages(link.nc, (after) => reader.runEventsPage(run.id, after), {
    ...opts,
    // The run's jobs belong to its owner: their live events announce the run's history.
    live: (["workflow", "job", "sandbox"] as const).map((kind) => link.names.subjects.ownerEventsOf(kind, owner)),
    done: (event) => {
      if (event.kind === "job") {
        if (isTerminal(event.state)) going.delete(event.jobId);
        else going.add(event.jobId);
      }
      if (event.kind === "workflow" && ["succeeded", "failed", "cancelled"].includes(event.type)) endedAt ??= Date.now();
      return endedAt !== undefined && going.size === 0;
    },
    // A job's final event that was never stored (its publish failed) does not hold it up for
    // ever: once the run's record says none is going, and a while after the run ended (an event
    // announced live may not be stored yet), the follow ends.
    finished: async () => endedAt !== undefined && Date.now() - endedAt > LOST_EVENT_GRACE_MS && !hasJobsGoing(await reader.getRun(run.id)),
  });
}
