import { DeliverPolicy, type JetStreamManager, type JsMsg, type MsgRequest, type StoredMsg } from "@nats-io/jetstream";
import type { Topology } from "./topology.js";

export interface ReadStreamOptions {
  /** Keep reading new messages as they arrive, until `until` says stop or `signal` aborts. */
  follow?: boolean;
  signal?: AbortSignal;
  /** Start at this stream sequence instead of the first message. */
  startSeq?: number;
  /** Start at the first message stored at or after this time (ISO 8601). */
  startTime?: string;
}

/**
 * Reads the messages of one stream that match `filter` (several subjects need nats-server 2.10), oldest first, through an ordered
 * consumer. Without `follow` it ends at the last stored message.
 */
export async function* readStream(
  topology: Topology,
  stream: string,
  filter: string | string[],
  opts: ReadStreamOptions = {},
): AsyncGenerator<JsMsg> {
  const consumer = await topology.js.consumers.get(stream, {
    filter_subjects: filter,
    ...(opts.startSeq
      ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: opts.startSeq }
      : opts.startTime
        ? { deliver_policy: DeliverPolicy.StartTime, opt_start_time: opts.startTime }
        : { deliver_policy: DeliverPolicy.All }),
  });
  if (!opts.follow) {
    const info = await consumer.info();
    if (info.num_pending === 0) return;
  }
  const messages = await consumer.consume({ max_messages: 256 });
  const onAbort = () => void messages.stop();
  opts.signal?.addEventListener("abort", onAbort, { once: true });
  if (opts.signal?.aborted) onAbort(); // aborted while the consumer was being made
  try {
    for await (const msg of messages) {
      yield msg;
      if (!opts.follow && msg.info.pending === 0) break;
    }
  } finally {
    opts.signal?.removeEventListener("abort", onAbort);
    await messages.close().catch(() => {});
  }
}

/**
 * The stored messages of `stream` on `filter` with sequences `from` to `upTo`, oldest first, one
 * direct get each (`next_by_subj`) and no consumer: for a few reads of the work stream, where a
 * consumer would be one more object on the server per scan.
 */
export async function* storedMessages(
  jsm: JetStreamManager,
  stream: string,
  filter: string,
  { from = 1, upTo = Number.POSITIVE_INFINITY }: { from?: number; upTo?: number } = {},
): AsyncGenerator<StoredMsg> {
  for (let seq = from; seq <= upTo; ) {
    const request = { seq, next_by_subj: filter } as unknown as MsgRequest; // STREAM.MSG.GET takes it
    const stored = await jsm.streams.getMessage(stream, request);
    if (!stored || stored.seq > upTo) return;
    yield stored;
    seq = stored.seq + 1;
  }
}
