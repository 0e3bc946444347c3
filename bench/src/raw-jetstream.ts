import { AckPolicy, jetstream, jetstreamManager, RetentionPolicy, StorageType } from "@nats-io/jetstream";
import { Kvm, KvWatchInclude } from "@nats-io/kv";
import { type ConnectionOptions, connect, type NatsConnection } from "@nats-io/transport-node";
import { Completions, type RunJob } from "./load.js";

/** The raw JetStream job path: no Boxcar code at all. */
export interface RawPath extends AsyncDisposable {
  run: RunJob;
  /** The submitter's connection (publishes work, watches results) and the worker's. */
  connections: { client: NatsConnection; worker: NatsConnection };
}

/**
 * The same shape as a Boxcar job done the plain NATS way, on its own connections:
 * - submitter: `js.publish(raw.<tag>.work, {id, input})` to a WorkQueue stream (file, R1);
 * - worker: a durable pull consumer read with the callback form of `consume()`; for each message
 *   `kv.put(id, {state: "succeeded", ...})`, then `ack()`;
 * - completion: one shared KV watcher on the results bucket (updates only) sees the put.
 */
export async function openRawPath(url: string, tag: string, connectOptions: ConnectionOptions = {}): Promise<RawPath> {
  const STREAM = `RAW_${tag.toUpperCase()}_WORK`;
  const SUBJECT = `raw.${tag}.work`;
  const DURABLE = "raw-worker";
  const BUCKET = `raw_${tag}_results`;
  const client = await connect({ ...connectOptions, servers: url, name: "raw-client" });
  const worker = await connect({ ...connectOptions, servers: url, name: "raw-worker" });

  const jsm = await jetstreamManager(client);
  await jsm.streams.add({
    name: STREAM,
    subjects: [SUBJECT],
    retention: RetentionPolicy.Workqueue,
    storage: StorageType.File,
    num_replicas: 1,
  });
  await jsm.consumers.add(STREAM, { durable_name: DURABLE, ack_policy: AckPolicy.Explicit, ack_wait: 30e9, max_ack_pending: 10_000 });
  const js = jetstream(client);
  const results = await new Kvm(js).create(BUCKET, { history: 1 });

  const completions = new Completions();
  const watch = await results.watch({ include: KvWatchInclude.UpdatesOnly });
  const watching = (async () => {
    for await (const entry of watch) {
      if (entry.operation === "PUT" && entry.json<{ state: string }>().state === "succeeded") completions.complete(entry.key);
    }
  })();

  const wjs = jetstream(worker);
  const workerResults = await new Kvm(wjs).open(BUCKET);
  const consumer = await wjs.consumers.get(STREAM, DURABLE);
  const messages = await consumer.consume({
    max_messages: 256,
    callback: (msg) => {
      const { id } = msg.json<{ id: string }>();
      workerResults.put(id, JSON.stringify({ id, state: "succeeded", exitCode: 0 })).then(
        () => msg.ack(),
        () => msg.nak(),
      );
    },
  });

  const run: RunJob = async (i) => {
    const id = `r${i}`;
    const done = completions.wait(id);
    await js.publish(SUBJECT, JSON.stringify({ id, input: i }));
    await done;
  };

  return {
    run,
    connections: { client, worker },
    async [Symbol.asyncDispose]() {
      await messages.close();
      watch.stop();
      await watching;
      await worker.drain();
      await client.drain();
    },
  };
}
