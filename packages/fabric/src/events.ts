import type { BoxcarEvent, Names } from "@boxcar/protocol";
import type { JetStreamClient } from "@nats-io/jetstream";

/** What publishing an event needs of the topology: its names and JetStream. */
export interface EventStream {
  readonly names: Names;
  readonly js: JetStreamClient;
}

/** The id an event is filed under: the job's for job and sandbox events, the worker's or run's otherwise. */
function eventSubjectId(event: BoxcarEvent): string {
  switch (event.kind) {
    case "worker":
      return event.workerId;
    case "workflow":
      return event.runId;
    case "session":
      return event.sessionId;
    default:
      return event.jobId;
  }
}

/** Job events an attempt may have more than one of (a prompt agent's loop has a step, tool call and result after another). */
const REPEATED: ReadonlySet<string> = new Set([
  "progress",
  "signal",
  "step",
  "tool_call",
  "tool_result",
  "compacted",
  "approval_requested",
]);

/**
 * Publishes one event to the events stream and waits for the stream to store it. A job event
 * (but progress, signals and a prompt agent's steps) carries the message id `<job>:<attempt>:<type>`: whoever publishes it again,
 * after a timeout or a crash, the stream keeps one copy (within its 2-minute duplicate window);
 * `dedupeAs` gives one its own id instead (an attempt's usage reports, one per read).
 */
export async function publishEvent(topology: EventStream, event: BoxcarEvent, dedupeAs?: string): Promise<void> {
  const owner = event.kind === "worker" ? undefined : event.owner;
  const subject = topology.names.subjects.event(event.kind, eventSubjectId(event), event.type, owner);
  const msgID =
    dedupeAs ?? (event.kind === "job" && !REPEATED.has(event.type) ? `${event.jobId}:${event.attempt}:${event.type}` : undefined);
  await topology.js.publish(subject, JSON.stringify(event), msgID ? { msgID } : undefined);
}

export const nowIso = (): string => new Date().toISOString();
