import type { Topology } from "@boxcar/fabric";
import type { MsgRequest } from "@nats-io/jetstream";
import type { KvWatchEntry } from "@nats-io/kv";

/** A dispatcher's watch on a bucket, replayed from its start. */
export interface BucketReplay {
  /** Resolves once every value stored when the watch began has been shown. */
  readonly caughtUp: Promise<void>;
  stop(): void;
}

/**
 * Watches one of the system's buckets (`jobs` or `workflows`): every key's latest value at
 * start, then each change, each shown to `onEntry`. Because it replays, a dispatcher that starts
 * after a crash picks up whatever was left; `caughtUp` says when that replay is over. Given
 * `after` (a sequence), it replays only what was written after it.
 */
export async function replayBucket(
  topology: Topology,
  bucket: "jobs" | "workflows",
  onEntry: (entry: KvWatchEntry) => void,
  after = 0,
): Promise<BucketReplay> {
  let markCaughtUp!: () => void;
  const caughtUp = new Promise<void>((resolve) => {
    markCaughtUp = resolve;
  });
  const name = topology.names.buckets[bucket];
  const { state } = await topology.jsm.streams.info(`KV_${name}`);
  // Nothing to replay: no entry will say the replay is over. (After `after`, the stream's last
  // sequences may be messages since removed, never shown.) Asked of the stream's leader: a
  // replicated bucket allows no direct gets.
  const firstAfter = { seq: after + 1, next_by_subj: `$KV.${name}.>` } as unknown as MsgRequest;
  const nothingAfter = async () => state.last_seq <= after || !(await topology.jsm.streams.getMessage(`KV_${name}`, firstAfter));
  if (state.messages === 0 || (after > 0 && (await nothingAfter()))) markCaughtUp();
  const watch = await topology[bucket].watch(after > 0 ? { resumeFromRevision: after + 1 } : {});
  void (async () => {
    for await (const entry of watch) {
      onEntry(entry);
      // The replay is over at its last entry (nothing pending behind it), or at the first change after it.
      if (entry.isUpdate || entry.delta === 0) markCaughtUp();
    }
  })();
  return { caughtUp, stop: () => watch.stop() };
}
