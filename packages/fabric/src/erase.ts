/**
 * Deleting a job's or a run's record for good, on a full store too: what retention and `boxcar
 * clean` do to a record once the rest of its job (or run) is gone. A record goes in two steps:
 * its delete marker, by compare-and-swap on the revision read (so that every dispatcher's watch
 * forgets it), then the marker itself, removed (by the caller, once every watch has had time to
 * show it: JetStream skips a removed message unseen), so that nothing of it stays in the bucket.
 * Nothing here needs more room than it has just freed: where the store has none for the marker,
 * the record's own bytes are removed first (by sequence, which writes nothing), and the marker,
 * never bigger than the record, is written in the room they leave.
 */

import { headers } from "@nats-io/transport-node";
import { isRevisionConflict, isStorageFull } from "./nats-errors.js";
import { removeMessage } from "./remove-message.js";
import type { Topology } from "./topology.js";

/** The buckets whose records are deleted for good. */
export type ErasableBucket = "jobs" | "workflows";

/** What `eraseEntry` did to a record. */
export type Erasure =
  /**
   * Gone, and its delete marker written: at `marker` when it is this call's (remove it with
   * `removeRevision` once the rest is removed); absent when another deletion's marker stands
   * (another dispatcher deleting the same record), which that one removes.
   */
  | { outcome: "erased"; marker?: number }
  /** Gone (purged), but the store had no room for its marker yet: watchers still count it until `markErased` writes one. */
  | { outcome: "unmarked" }
  /** It changed since it was read (a later revision stands, a retried job's say): nothing was removed. */
  | { outcome: "changed" }
  /** Gone, and a new record of that key written since (the same idempotency key admitted again): what belongs to the key is the new one's now. */
  | { outcome: "superseded" };

const subjectOf = (topology: Topology, bucket: ErasableBucket, key: string) => `$KV.${topology.names.buckets[bucket]}.${key}`;
const streamOf = (topology: Topology, bucket: ErasableBucket) => `KV_${topology.names.buckets[bucket]}`;

/**
 * Deletes `key`'s record as it was read at `revision` (compare-and-swap): its delete marker
 * replaces it; on a full store the revision is purged first and the marker written in the room
 * that frees. See `Erasure` for the outcomes.
 */
export async function eraseEntry(topology: Topology, bucket: ErasableBucket, key: string, revision: number): Promise<Erasure> {
  try {
    return { outcome: "erased", marker: await writeMarker(topology, bucket, key, revision) };
  } catch (err) {
    if (isRevisionConflict(err)) return (await latest(topology, bucket, key)) === "DEL" ? { outcome: "erased" } : { outcome: "changed" };
    if (!isStorageFull(err)) throw err;
  }
  // No room for the marker: the revision read goes first (a later one stays), freeing more than
  // the marker takes.
  await removeRevision(topology, bucket, key, revision);
  if ((await latest(topology, bucket, key)) === "PUT") return { outcome: "changed" };
  return markErased(topology, bucket, key);
}

/**
 * Writes the delete marker of a record already purged (one `eraseEntry` left `unmarked`):
 * `erased` with its sequence; `unmarked` while the store has no room; `superseded` when a new
 * record of that key was written since (its marker would wrongly delete it, so none is written).
 */
export async function markErased(topology: Topology, bucket: ErasableBucket, key: string): Promise<Erasure> {
  try {
    return { outcome: "erased", marker: await writeMarker(topology, bucket, key, 0) };
  } catch (err) {
    if (isStorageFull(err)) return { outcome: "unmarked" };
    if (!isRevisionConflict(err)) throw err;
    return (await latest(topology, bucket, key)) === "PUT" ? { outcome: "superseded" } : { outcome: "erased" };
  }
}

/**
 * Removes one revision of `key`'s record (or its delete marker) from the bucket's stream by its
 * sequence, writing nothing; a later message of the key stays. Resolves with whether it was
 * there (false: gone already, or replaced by a later revision: a bucket keeps one per key).
 */
export function removeRevision(topology: Topology, bucket: ErasableBucket, key: string, seq: number): Promise<boolean> {
  return removeMessage(topology.jsm, streamOf(topology, bucket), subjectOf(topology, bucket, key), seq);
}

/** A KV delete marker, written only if the key's last message is at `after` (0: the key has none). */
async function writeMarker(topology: Topology, bucket: ErasableBucket, key: string, after: number): Promise<number> {
  const marker = headers();
  marker.set("KV-Operation", "DEL");
  const ack = await topology.js.publish(subjectOf(topology, bucket, key), new Uint8Array(0), {
    headers: marker,
    expect: { lastSubjectSequence: after },
  });
  return ack.seq;
}

/** What `key` holds now, as a KV read sees it. */
async function latest(topology: Topology, bucket: ErasableBucket, key: string): Promise<"PUT" | "DEL" | undefined> {
  const entry = await topology[bucket].get(key);
  if (!entry) return undefined;
  return entry.operation === "PUT" ? "PUT" : "DEL";
}
