import { endianness } from "node:os";
import { isTerminal, JobState } from "@boxcar/protocol";
import type { IndexImage } from "./job-index.js";

/**
 * A job index's image as bytes, and back: a header (JSON: what the caller keeps with it, the
 * counts, the names), then each column as it is in memory, then the ids. A million settled jobs
 * make about 65 MB, read back in well under a second (docs/benchmarks.md, "Listing jobs").
 *
 * Layout: `BXIX`, a version byte, the header's length (4 bytes) and the header; the states (a
 * byte a job); agents, pools and owners (4 bytes each a job); sizes, artifacts and end times (8
 * bytes each a job); the settled ids then the unsettled ones, each list joined by newlines (an
 * id is a KV key, which has none). Numbers are in the writer's byte order, which the header
 * names; a reader of the other order refuses it.
 */

const MAGIC = "BXIX";
/** A KV key, as a job id must be. */
const KEY = /^[-/_=.a-zA-Z0-9]+$/;
const VERSION = 1;

interface Header<Meta> {
  meta: Meta;
  order: "LE" | "BE";
  settled: number;
  unsettled: number;
  names: string[];
  /** The byte lengths of the two id lists. */
  idBytes: [number, number];
}

/** `image` as bytes, with `meta` (JSON) in its header. */
export function encodeImage<Meta>(image: IndexImage, meta: Meta): Uint8Array {
  const settledIds = Buffer.from(image.ids.join("\n"));
  const unsettledIds = Buffer.from(image.unsettled.join("\n"));
  const header: Header<Meta> = {
    meta,
    order: endianness(),
    settled: image.ids.length,
    unsettled: image.unsettled.length,
    names: image.names,
    idBytes: [settledIds.length, unsettledIds.length],
  };
  const head = Buffer.from(JSON.stringify(header));
  const length = Buffer.alloc(4);
  length.writeUInt32LE(head.length);
  const columns = [image.states, image.agents, image.pools, image.owners, image.bytes, image.artifacts, image.endedAt];
  return Buffer.concat([
    Buffer.from(MAGIC),
    Buffer.of(VERSION),
    length,
    head,
    ...columns.map((c) => new Uint8Array(c.buffer, c.byteOffset, c.byteLength)),
    settledIds,
    unsettledIds,
  ]);
}

/** An image's bytes that are not one, each with what is wrong. */
export class BadImageError extends Error {}

/** The image and meta in `bytes`; throws `BadImageError` naming what is wrong with them. */
export function decodeImage(bytes: Uint8Array): { meta: unknown; image: IndexImage } {
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const bad = (why: string) => new BadImageError(`not a job index snapshot: ${why}`);
  if (buf.length < 9 || buf.toString("latin1", 0, 4) !== MAGIC) throw bad("it does not begin with BXIX");
  if (buf[4] !== VERSION) throw bad(`its version is ${buf[4]}, this dispatcher reads ${VERSION}`);
  const headLength = buf.readUInt32LE(5);
  let header: Header<unknown>;
  try {
    header = JSON.parse(buf.toString("utf8", 9, 9 + headLength));
  } catch (err) {
    throw bad(`its header is not JSON (${(err as Error).message})`);
  }
  if (typeof header !== "object" || header === null) throw bad("its header is not an object");
  const { settled: n, unsettled: m, names, idBytes } = header;
  if (header.order !== endianness()) throw bad(`its numbers are ${header.order}, this machine's are ${endianness()}`);
  if (!Number.isSafeInteger(n) || n < 0 || !Number.isSafeInteger(m) || m < 0) throw bad("its job counts are not counts");
  if (!Array.isArray(names) || names.some((name) => typeof name !== "string")) throw bad("its names are not strings");
  if (!Array.isArray(idBytes) || idBytes.length !== 2 || !idBytes.every((b) => Number.isSafeInteger(b) && b >= 0))
    throw bad("its id lengths are not lengths");
  const expected = 9 + headLength + n * (1 + 3 * 4 + 3 * 8) + idBytes[0] + idBytes[1];
  if (buf.length !== expected) throw bad(`it is ${buf.length} bytes, its header says ${expected}`);
  let at = 9 + headLength;
  // Each column copied out, so that it is aligned and owns its memory.
  const take = (width: number): ArrayBuffer => {
    const copy = new Uint8Array(buf.buffer, buf.byteOffset + at, n * width).slice().buffer;
    at += n * width;
    return copy;
  };
  const states = new Uint8Array(take(1));
  const [agents, pools, owners] = [new Uint32Array(take(4)), new Uint32Array(take(4)), new Uint32Array(take(4))];
  const [sizes, artifacts, endedAt] = [new Float64Array(take(8)), new Float64Array(take(8)), new Float64Array(take(8))];
  const ids = (count: number, length: number): string[] => {
    const list = count === 0 ? [] : buf.toString("utf8", at, at + length).split("\n");
    at += length;
    if (list.length !== count) throw bad(`it lists ${list.length} ids where its header says ${count}`);
    const wrong = list.find((id) => !KEY.test(id));
    if (wrong !== undefined) throw bad(`${JSON.stringify(wrong)} is not a job id`);
    return list;
  };
  const image: IndexImage = {
    ids: ids(n, idBytes[0]),
    states,
    agents,
    pools,
    owners,
    names,
    bytes: sizes,
    artifacts,
    endedAt,
    unsettled: ids(m, idBytes[1]),
  };
  const stateOf = JobState.options;
  for (let i = 0; i < n; i++) {
    const state = stateOf[states[i] as number];
    if (state === undefined) throw bad(`job ${image.ids[i]} has no state numbered ${states[i]}`);
    if (!isTerminal(state)) throw bad(`job ${image.ids[i]} is ${state}, not ended`);
    for (const codes of [agents, pools, owners])
      if ((codes[i] as number) >= names.length) throw bad(`job ${image.ids[i]} names name ${codes[i]} of ${names.length}`);
    if (!Number.isFinite(endedAt[i])) throw bad(`job ${image.ids[i]} has no end time`);
    if (!((sizes[i] as number) >= 0 && (artifacts[i] as number) >= 0 && Number.isFinite((sizes[i] as number) + (artifacts[i] as number))))
      throw bad(`job ${image.ids[i]}'s sizes are not sizes`);
  }
  return { meta: header.meta, image };
}
