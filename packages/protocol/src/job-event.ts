import { ownerOf } from "./access.js";
import { PROTOCOL_VERSION } from "./agent.js";
import type { JobEvent } from "./events.js";
import type { JobRecord } from "./job.js";

/** A job event that reports `record` as it stands (its state, attempt, error and run). */
export function jobEvent(record: JobRecord, type: JobEvent["type"], extra: Partial<JobEvent> = {}): JobEvent {
  return {
    v: PROTOCOL_VERSION,
    at: new Date().toISOString(),
    kind: "job",
    type,
    jobId: record.id,
    owner: ownerOf(record),
    agent: record.agent,
    state: record.state,
    attempt: record.attempt,
    ...(record.error ? { error: record.error } : {}),
    ...(record.chain?.run ? { run: record.chain.run } : {}),
    ...extra,
  };
}
