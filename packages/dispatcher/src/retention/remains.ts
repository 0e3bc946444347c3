import type { Topology } from "@boxcar/fabric";
import { removeObject } from "@boxcar/fabric/internal";
import { harnessObjects, type JobRecord, ownerOf, recordedCallObject } from "@boxcar/protocol";

/**
 * What a job's deletion removes besides its record: its events and output (by its owner, in
 * their subjects), the objects it names (input files, artifacts), its recorded model calls and
 * its checkpoint.
 */
export interface Remains {
  owner: string;
  objects: string[];
  /** How many model calls it made: its recorded calls are at most these (and any past them still found). */
  calls: number;
}

/** The objects a job names: its input files and its artifacts. */
export const objectsOf = (job: JobRecord): string[] => [
  ...(job.spec?.files ?? []).map((f) => f.object),
  ...job.artifacts.map((a) => a.object),
];

export const remainsOf = (job: JobRecord): Remains => ({
  owner: ownerOf(job),
  objects: [...new Set(objectsOf(job))],
  calls: job.usage?.calls ?? 0,
});

/**
 * Removes what belongs to job `id` besides its record, writing nothing (every step is a purge, so
 * it works on a store filled to its last byte) and idempotent (a step done already does nothing).
 */
export async function removeRemains(topology: Topology, id: string, remains: Remains): Promise<void> {
  const { names } = topology;
  await topology.jsm.streams.purge(names.streams.events, { filter: names.subjects.jobEvents(remains.owner, id) });
  await topology.jsm.streams.purge(names.streams.logs, { filter: names.subjects.jobLogs(remains.owner, id) });
  for (const object of remains.objects) await removeObject(topology, object);
  await removeRecordedCalls(topology, id, remains.calls);
  await removeCheckpoint(topology, id);
}

/**
 * Asks JetStream to purge nothing from each stream a deletion purges (a purge up to sequence 1,
 * filtered on a job's subjects): a dispatcher whose credential predates retention is refused
 * here, before it has removed anything of any job.
 */
export async function checkMayPurge(topology: Topology): Promise<void> {
  const { names } = topology;
  const nothing = { seq: 1 };
  await topology.jsm.streams.purge(names.streams.events, { filter: names.subjects.jobEvents("_", "_"), ...nothing });
  await topology.jsm.streams.purge(names.streams.logs, { filter: names.subjects.jobLogs("_", "_"), ...nothing });
  await topology.jsm.streams.purge(`KV_${names.buckets.jobs}`, { filter: `$KV.${names.buckets.jobs}._`, ...nothing });
  await topology.jsm.streams.purge(`OBJ_${names.buckets.artifacts}`, { filter: `$O.${names.buckets.artifacts}.C._`, ...nothing });
}

/** Removes a prompt agent's checkpoint (docs/harness.md#durable-steps): its loop's state, and its workspace if kept. */
async function removeCheckpoint(topology: Topology, jobId: string): Promise<void> {
  const { state, workspace } = harnessObjects(jobId);
  const info = await topology.artifacts.info(state);
  if (!info) return;
  await removeObject(topology, workspace);
  await removeObject(topology, state);
}

/**
 * Removes the job's recorded model calls (`models.record`), one object per place in its
 * attempts' sequence: at most as many as the calls it made, and any past those still found.
 */
async function removeRecordedCalls(topology: Topology, jobId: string, made: number): Promise<void> {
  for (let position = 1; ; position++) {
    const name = recordedCallObject(jobId, position);
    const info = await topology.artifacts.info(name);
    if (info) await removeObject(topology, name);
    else if (position > made) return;
  }
}
