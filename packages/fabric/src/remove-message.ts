import type { JetStreamManager } from "@nats-io/jetstream";
import { isNoMessage, isPermissionViolation } from "./nats-errors.js";

/** Per stream, whether it keeps one message a subject (asked once a process). */
const oneASubject = new WeakMap<JetStreamManager, Map<string, Promise<boolean>>>();

function keepsOneASubject(jsm: JetStreamManager, stream: string): Promise<boolean> {
  const streams = oneASubject.get(jsm) ?? new Map<string, Promise<boolean>>();
  oneASubject.set(jsm, streams);
  let known = streams.get(stream);
  if (!known) {
    known = jsm.streams.info(stream).then((info) => info.config.max_msgs_per_subject === 1);
    known.catch(() => streams.delete(stream)); // asked again next time
    streams.set(stream, known);
  }
  return known;
}

/**
 * Removes the message at `seq` of `stream`, on `subject`, and any earlier one of that subject,
 * writing nothing. Resolves with whether anything went (false: gone already, or replaced).
 *
 * In a bucket that keeps one message a key (as Boxcar makes the jobs and workflows buckets) that
 * is one delete by sequence: nats-server 2.10 scans the stream for a purge filtered on a subject,
 * 160-200 ms of its CPU in a bucket of a million records, where a delete takes 0.5 ms
 * (docs/operations.md). A bucket made before keeps 5 revisions a key, and a credential made
 * before dispatchers were let delete by sequence is refused that: for either, the purge up to
 * `seq` (a later message stays), as before.
 */
export async function removeMessage(jsm: JetStreamManager, stream: string, subject: string, seq: number): Promise<boolean> {
  if (await keepsOneASubject(jsm, stream)) {
    try {
      return await jsm.streams.deleteMessage(stream, seq, false);
    } catch (err) {
      if (isNoMessage(err)) return false;
      if (!isPermissionViolation(err)) throw err;
    }
  }
  return (await jsm.streams.purge(stream, { filter: subject, seq: seq + 1 })).purged > 0;
}
