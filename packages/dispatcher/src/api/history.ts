import { jsonOf } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { readStream } from "@boxcar/fabric/internal";
import {
  BoxcarEvent,
  type EventsPage,
  type Identity,
  JobEventsRequest,
  JobLogsRequest,
  type LogsPage,
  ownerOf,
  parseWith,
  RunEventsRequest,
  unfoldEvents,
  type WorkflowRun,
} from "@boxcar/protocol";
import type { JsMsg } from "@nats-io/jetstream";
import { getRecord } from "../jobs/jobs.js";
import type { Runs } from "../workflows/runs.js";

/**
 * A job's or run's stored events and output, read a page at a time for callers that may see
 * them. Clients have no JetStream access of their own (see `access.ts`): this is how they read
 * history, and a live follow asks for the next page when a message arrives on the subject.
 */

/** At most this many messages are looked at for one page, and at most this many bytes returned (a reply must fit a message). */
const PAGE_MESSAGES = 256;
const PAGE_BYTES = 384 * 1024;

interface Page {
  messages: JsMsg[];
  last: number;
  more: boolean;
}

/** The messages of `stream` on `filter` after sequence `after` (or from `startTime`), one page. */
async function readPage(topology: Topology, stream: string, filter: string, after: number, startTime?: string): Promise<Page> {
  const messages: JsMsg[] = [];
  let last = after;
  let bytes = 0;
  const from = after > 0 ? { startSeq: after + 1 } : startTime ? { startTime } : {};
  for await (const msg of readStream(topology, stream, filter, from)) {
    if (messages.length === PAGE_MESSAGES || (messages.length > 0 && bytes + msg.data.length > PAGE_BYTES)) {
      return { messages, last, more: true };
    }
    messages.push(msg);
    bytes += msg.data.length;
    last = msg.seq;
  }
  return { messages, last, more: false };
}

/** The events a stored message stands for: one, or an attempt's folded into its last. */
const eventsOf = (msg: JsMsg): BoxcarEvent[] => {
  const parsed = BoxcarEvent.safeParse(jsonOf(msg));
  return parsed.success ? unfoldEvents(parsed.data) : [];
};

export async function jobEvents(topology: Topology, body: unknown, caller: Identity): Promise<EventsPage> {
  const { id, after } = parseWith(JobEventsRequest, body, "request");
  const job = await getRecord(topology, id, caller);
  return eventsPage(topology, topology.names.subjects.jobEvents(ownerOf(job), id), after);
}

export async function jobLogs(topology: Topology, body: unknown, caller: Identity): Promise<LogsPage> {
  const { id, after } = parseWith(JobLogsRequest, body, "request");
  const job = await getRecord(topology, id, caller);
  return logsPage(topology, topology.names.subjects.jobLogs(ownerOf(job), id), after);
}

/** One page of the events on `filter` (a job's, a session's), after sequence `after`. */
export async function eventsPage(topology: Topology, filter: string, after: number): Promise<EventsPage> {
  const page = await readPage(topology, topology.names.streams.events, filter, after);
  return { events: page.messages.flatMap(eventsOf), last: page.last, more: page.more };
}

/** One page of the output on `filter` (`<prefix>.log.<owner>.<id>.*`: a job's or a session's). */
export async function logsPage(topology: Topology, filter: string, after: number): Promise<LogsPage> {
  const page = await readPage(topology, topology.names.streams.logs, filter, after);
  const chunks = page.messages.map((m) => ({
    stream: m.subject.endsWith(".stderr") ? ("stderr" as const) : ("stdout" as const),
    data: Buffer.from(m.data).toString("base64"),
  }));
  return { chunks, last: page.last, more: page.more };
}

/**
 * A run's events and those of its jobs and their sandboxes, in the order they were stored. They
 * are read from the owner's events since shortly before the run was made, so a page may skip
 * many events of the owner's other work.
 */
export async function runEvents(topology: Topology, runs: Runs, body: unknown, caller: Identity): Promise<EventsPage> {
  const { id, after } = parseWith(RunEventsRequest, body, "request");
  const run = await runs.require(id, caller);
  const { names } = topology;
  // A margin for clocks that differ between the dispatcher that stamped the run and the server.
  const startTime = new Date(Date.parse(run.createdAt) - 5_000).toISOString();
  const page = await readPage(topology, names.streams.events, names.subjects.ownerEvents(ownerOf(run)), after, startTime);
  const jobs = runJobs(run);
  const events: BoxcarEvent[] = [];
  for (const event of page.messages.flatMap(eventsOf)) {
    if (event.kind === "job" && event.run === id) jobs.add(event.jobId);
    const ours =
      (event.kind === "workflow" && event.runId === id) ||
      (event.kind === "job" && event.run === id) ||
      (event.kind === "sandbox" && jobs.has(event.jobId));
    if (ours) events.push(event);
  }
  return { events, last: page.last, more: page.more };
}

const runJobs = (run: WorkflowRun): Set<string> =>
  new Set(Object.values(run.steps).flatMap((step) => step.instances.flatMap((instance) => instance.jobs)));
