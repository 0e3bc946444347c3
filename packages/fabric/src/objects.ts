import type { Topology } from "./topology.js";

/**
 * Removes an object from the system's Object Store for good: its chunks, and then its metadata,
 * which a plain delete leaves behind as a `deleted` entry (one per object, piling up). Nothing
 * happens for an object that does not exist. The metadata subject is the Object Store's own
 * (`$O.<bucket>.M.<name, base64url with padding>`).
 */
export async function removeObject(topology: Topology, name: string): Promise<void> {
  await topology.artifacts.delete(name);
  const bucket = topology.names.buckets.artifacts;
  const encoded = Buffer.from(name).toString("base64").replaceAll("+", "-").replaceAll("/", "_");
  await topology.jsm.streams.purge(`OBJ_${bucket}`, { filter: `$O.${bucket}.M.${encoded}` });
}
