import type { BoxcarEvent } from "@boxcar/protocol";
import type { Topology } from "./topology.js";

/** The id an event is filed under: the job's for job and sandbox events, the worker's or run's otherwise. */
function eventSubjectId(event: BoxcarEvent): string {
  switch (event.kind) {
    case "worker":
      return event.workerId;
    case "workflow":
      return event.runId;
    default:
      return event.jobId;
  }
}

/** Publishes one event to the events stream and waits for the stream to store it. */
export async function publishEvent(topology: Topology, event: BoxcarEvent): Promise<void> {
  const subject = topology.names.subjects.event(event.kind, eventSubjectId(event), event.type);
  await topology.js.publish(subject, JSON.stringify(event));
}

export const nowIso = (): string => new Date().toISOString();
