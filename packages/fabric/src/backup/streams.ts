/**
 * The streams of one Boxcar system as `boxcar backup` and `boxcar restore` see them (docs/backup.md):
 * every stream, KV bucket's stream and Object Store's stream a prefix may have, with the subjects
 * each captures (`systemStreams`), whether one exists on this NATS system (`streamInfo`), NATS
 * subject matching (`subjectMatches`), and what one stream's copy or restore came to (`StreamSummary`).
 */

import { type Names, names as namesFor } from "@boxcar/protocol";
import type { JetStreamManager, StreamInfo } from "@nats-io/jetstream";
import { isNotFound } from "../nats-errors.js";

/** One stream a Boxcar system may keep: a stream of its own, a KV bucket's or an Object Store's. */
export interface SystemStream {
  readonly name: string;
  readonly kind: "stream" | "kv" | "object";
  /** The subjects such a stream captures, exactly. */
  readonly subjects: readonly string[];
}

/**
 * Every stream a system of `prefix` may have, from `names(prefix)`: its own streams, and for each
 * of its buckets both the KV stream (`KV_<bucket>`) and the Object Store stream (`OBJ_<bucket>`)
 * that bucket could be, since `Names` does not say which kind each is (only one of the two
 * exists). In backup order: work items and submissions first, then the records, then the files,
 * then history. A record copied after its work item is the newer of the two: a restored job
 * either has both, or a record that moved on past its item (a worker drops the item), or a
 * queued record with no item, which a dispatcher's work recovery enqueues again.
 */
export function systemStreams(prefix: string): SystemStream[] {
  const names = namesFor(prefix);
  const own = (Object.keys(names.streams) as (keyof Names["streams"])[]).map((key) => {
    const subject = (names.subjects as unknown as Record<string, unknown>)[`${key}All`];
    if (typeof subject !== "string") throw new Error(`no subject ${key}All for the ${key} stream`);
    return { name: names.streams[key], kind: "stream" as const, subjects: [subject], key };
  });
  const isIntake = (s: { key: string }) => s.key === "work" || s.key === "submit";
  const first = ["work", "submit"].flatMap((key) => own.filter((s) => s.key === key));
  const history = own.filter((s) => !isIntake(s));
  const buckets = Object.values(names.buckets);
  return [
    ...first,
    ...buckets.map((b) => ({ name: `KV_${b}`, kind: "kv" as const, subjects: [`$KV.${b}.>`] })),
    ...buckets.map((b) => ({ name: `OBJ_${b}`, kind: "object" as const, subjects: [`$O.${b}.C.>`, `$O.${b}.M.>`] })),
    ...history,
  ].map(({ name, kind, subjects }) => ({ name, kind, subjects }));
}

/** What one stream's copy or restore came to. */
export interface StreamSummary {
  stream: string;
  messages: number;
  /** Bytes of the messages' data and headers. */
  bytes: number;
  /** The stream's last sequence as backed up: a restored stream goes on from there. */
  lastSeq: number;
}

/** Whether `subject` is matched by the NATS subject filter `filter` (`*` one token, `>` the rest). */
export function subjectMatches(filter: string, subject: string): boolean {
  const f = filter.split(".");
  const s = subject.split(".");
  for (let i = 0; i < f.length; i++) {
    if (f[i] === ">") return s.length > i;
    if (i >= s.length) return false;
    if (f[i] !== "*" && f[i] !== s[i]) return false;
    if (s[i] === "") return false;
  }
  return f.length === s.length;
}

export async function streamInfo(jsm: JetStreamManager, name: string): Promise<StreamInfo | undefined> {
  try {
    return await jsm.streams.info(name);
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}
