import {
  BoxcarError,
  BoxcarEvent,
  ErrorCode,
  handoffPending,
  isRunFinal,
  isTerminal,
  type JobRecord,
  ownerOf,
  parseWith,
  type WorkflowRun as Run,
} from "@boxcar/protocol";
import type { FollowOptions } from "./client.js";
import { readStream } from "./stream-reader.js";
import type { Topology } from "./topology.js";

/**
 * How a client reads records: through the dispatchers' API, which checks that the caller may see
 * them. Waiting and following never read the jobs or workflows buckets, which a submitter's
 * credential may not.
 */
export interface RecordReader {
  getJob(id: string): Promise<JobRecord>;
  getRun(id: string): Promise<Run>;
}

/**
 * How often a wait asks for the record again although no event came: events can be missing
 * (their publish is not retried), the record cannot.
 */
const RECHECK_MS = 5_000;

/**
 * Waits until `done` holds for the record: `first` as the caller read it, then read again after
 * every event on `filter` that `matters`, and every few seconds in any case. The follow starts
 * at or before the time of the first read (`startTime`, or the filter's whole history), so an
 * event that came after it is not missed.
 */
async function waitUntil<T>(
  topology: Topology,
  events: { filter: string; startTime?: string },
  first: T,
  read: () => Promise<T>,
  done: (value: T) => boolean,
  matters: (event: BoxcarEvent) => boolean,
  signal?: AbortSignal,
): Promise<T> {
  if (done(first)) return first; // no follow needed
  const stop = new AbortController();
  const following = signal ? AbortSignal.any([signal, stop.signal]) : stop.signal;
  let pending = false;
  let wake: (() => void) | undefined;
  const pump = (async () => {
    const stream = readStream(topology, topology.names.streams.events, events.filter, {
      follow: true,
      signal: following,
      ...(events.startTime ? { startTime: events.startTime } : {}),
    });
    for await (const msg of stream) {
      const event = BoxcarEvent.safeParse(msg.json());
      if (!event.success || !matters(event.data)) continue;
      pending = true;
      wake?.();
    }
  })().catch(() => {}); // a follow that fails leaves the periodic reads
  try {
    for (let value = first; ; value = await read()) {
      if (done(value)) return value;
      if (signal?.aborted) throw new BoxcarError(ErrorCode.cancelled, "stopped waiting");
      if (pending) {
        pending = false;
        continue;
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(finish, RECHECK_MS);
        function finish() {
          clearTimeout(timer);
          wake = undefined;
          signal?.removeEventListener("abort", finish);
          resolve();
        }
        wake = finish;
        signal?.addEventListener("abort", finish, { once: true });
      });
      pending = false;
    }
  } finally {
    stop.abort();
    await pump;
  }
}

/** A job's record (`job`, as just read) once `done` holds for it. */
export function waitForJobRecord(
  topology: Topology,
  reader: RecordReader,
  job: JobRecord,
  done: (job: JobRecord) => boolean,
  signal?: AbortSignal,
): Promise<JobRecord> {
  // A job has a few events: read them all rather than trust two clocks to agree on a start time.
  return waitUntil(
    topology,
    { filter: topology.names.subjects.jobEvents(ownerOf(job), job.id) },
    job,
    () => reader.getJob(job.id),
    done,
    (e) => e.kind === "job" && isTerminal(e.state),
    signal,
  );
}

/** The last job of the chain `jobId` starts, once it has ended (its handoff, if any, decided and followed). */
export async function waitForChainEnd(topology: Topology, reader: RecordReader, jobId: string, signal?: AbortSignal): Promise<JobRecord> {
  for (let id = jobId; ; ) {
    const job = await waitForJobRecord(topology, reader, await reader.getJob(id), (j) => isTerminal(j.state) && !handoffPending(j), signal);
    if (!job.handoff?.jobId) return job;
    id = job.handoff.jobId;
  }
}

/** A run once it has ended and none of its jobs is still going. */
export async function waitForRunEnd(topology: Topology, reader: RecordReader, runId: string, signal?: AbortSignal): Promise<Run> {
  // Not the owner's whole history: from a little before the first read, a margin for clocks that differ.
  const startTime = new Date(Date.now() - 5_000).toISOString();
  const run = await reader.getRun(runId);
  // The run's events and its jobs' final events, all under its owner.
  return waitUntil(
    topology,
    { filter: topology.names.subjects.ownerEvents(ownerOf(run)), startTime },
    run,
    () => reader.getRun(runId),
    (r) => isRunFinal(r.state) && !hasJobsGoing(r),
    (e) => (e.kind === "workflow" && e.runId === runId) || (e.kind === "job" && e.run === runId && isTerminal(e.state)),
    signal,
  );
}

const hasJobsGoing = (run: Run): boolean =>
  Object.values(run.steps).some((s) => s.instances.some((i) => i.state === "running" || i.state === "starting"));

/**
 * The events of a job and of the jobs it hands off to, one job after the other. With `follow`
 * it waits for each job's handoff decision and ends with the chain's last job.
 */
export async function* followChain(
  topology: Topology,
  reader: RecordReader,
  first: JobRecord,
  opts: FollowOptions = {},
): AsyncGenerator<BoxcarEvent> {
  const { names } = topology;
  const owner = ownerOf(first); // every job of a chain belongs to its first job's owner
  for (let id: string | undefined = first.id; id !== undefined; ) {
    const current: string = id;
    id = undefined;
    for await (const msg of readStream(topology, names.streams.events, names.subjects.jobEvents(owner, current), opts)) {
      const event = parseWith(BoxcarEvent, msg.json(), `event ${msg.subject}`);
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

/**
 * A run's events and the events of its jobs (and their sandboxes), in the order they were
 * stored. With `follow`, until the run's final event.
 */
export async function* followRun(topology: Topology, run: Run, opts: FollowOptions = {}): AsyncGenerator<BoxcarEvent> {
  const runId = run.id;
  const { names } = topology;
  // The run's jobs belong to its owner: one filter, the owner's events, covers the run and its jobs.
  const filter = names.subjects.ownerEvents(ownerOf(run));
  const jobs = new Set<string>();
  // A margin for clocks that differ between the dispatcher that stamped the run and the server.
  const startTime = new Date(Date.parse(run.createdAt) - 5_000).toISOString();
  for await (const msg of readStream(topology, names.streams.events, filter, { ...opts, startTime })) {
    const event = parseWith(BoxcarEvent, msg.json(), `event ${msg.subject}`);
    if (event.kind === "job" && event.run === runId) jobs.add(event.jobId);
    const ours =
      (event.kind === "workflow" && event.runId === runId) ||
      (event.kind === "job" && event.run === runId) ||
      (event.kind === "sandbox" && jobs.has(event.jobId));
    if (!ours) continue;
    yield event;
    if (opts.follow && event.kind === "workflow" && ["succeeded", "failed", "cancelled"].includes(event.type)) return;
  }
}
