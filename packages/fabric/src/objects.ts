import type { Topology } from "./topology.js";

/**
 * Removes an object from the system's Object Store for good, writing nothing: its chunks are
 * purged, then its metadata (the Object Store's own delete writes a `deleted` entry first, which
 * a full store refuses, and which would pile up, one per object). Works on a store filled to its
 * last byte. Only the metadata as it was read goes (a purge up to its sequence): an object put
 * again under the name meanwhile stays. Nothing happens for an object that does not exist; one
 * whose removal was cut short (chunks gone, metadata left) is removed by the next call. The
 * subjects are the Object Store's own (`$O.<bucket>.M.<name, base64url with padding>` and
 * `$O.<bucket>.C.<nuid>`).
 */
export async function removeObject(topology: Topology, name: string): Promise<void> {
  const bucket = topology.names.buckets.artifacts;
  const stream = `OBJ_${bucket}`;
  const encoded = Buffer.from(name).toString("base64").replaceAll("+", "-").replaceAll("/", "_");
  const metaSubject = `$O.${bucket}.M.${encoded}`;
  const meta = await topology.jsm.streams.getMessage(stream, { last_by_subj: metaSubject });
  if (!meta) return;
  const { nuid } = meta.json<{ nuid?: string }>();
  if (nuid) await topology.jsm.streams.purge(stream, { filter: `$O.${bucket}.C.${nuid}` });
  await topology.jsm.streams.purge(stream, { filter: metaSubject, seq: meta.seq + 1 });
}
