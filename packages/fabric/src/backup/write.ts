/**
 * Writing a backup (`boxcar backup`, docs/backup.md): `backupSystem` copies every stream of a
 * system, live and one after another, to `FILE.partial` (mode 0600) and renames it when complete;
 * each stream is copied from its first message until the copy has caught up with it, through an
 * ordered consumer, or, for a work queue, one message get at a time.
 */

import { rename, rm, stat } from "node:fs/promises";
import { BoxcarError, ErrorCode, names as namesFor } from "@boxcar/protocol";
import {
  DeliverPolicy,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
  type MsgRequest,
  RetentionPolicy,
} from "@nats-io/jetstream";
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";
import { BACKUP_FORMAT, BACKUP_VERSION, headerBytes, LineWriter, type MessageLine, MiB } from "./format.js";
import { type StreamSummary, streamInfo, systemStreams } from "./streams.js";

export interface BackupOptions {
  prefix: string;
  /** Where the backup goes; it is written to `FILE.partial` (mode 0600) and renamed when complete. */
  file: string;
  signal?: AbortSignal;
  /** Called as each stream's copy ends. */
  onStream?: (summary: StreamSummary) => void;
}

export interface BackupSummary {
  file: string;
  prefix: string;
  createdAt: string;
  streams: StreamSummary[];
  messages: number;
  bytes: number;
  /** The size of the file (compressed). */
  fileBytes: number;
  ms: number;
}

/** How long the copy of a stream waits without a message before it asks whether any are left. */
const IDLE_CHECK_MS = 1_000;

/**
 * Copies every stream of the system of `opts.prefix` to `opts.file`, live: each stream from its
 * first message until the copy has caught up with it (at least to its last sequence when its copy
 * began). Refuses when the prefix has no system here (no work stream). Streams are copied one
 * after another, so each is consistent only with itself (docs/backup.md).
 */
export async function backupSystem(nc: NatsConnection, opts: BackupOptions): Promise<BackupSummary> {
  const started = Date.now();
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const present: string[] = [];
  for (const stream of systemStreams(opts.prefix)) if (await streamInfo(jsm, stream.name)) present.push(stream.name);
  const work = namesFor(opts.prefix).streams.work;
  if (!present.includes(work)) {
    throw new BoxcarError(ErrorCode.notFound, `no Boxcar system with prefix ${opts.prefix} here: there is no stream ${work}`);
  }

  const partial = `${opts.file}.partial`;
  const out = await LineWriter.open(partial);
  const createdAt = new Date().toISOString();
  const streams: StreamSummary[] = [];
  try {
    await out.write({
      format: BACKUP_FORMAT,
      version: BACKUP_VERSION,
      prefix: opts.prefix,
      createdAt,
      server: { version: nc.info?.version, cluster: nc.info?.cluster },
      streams: present,
    });
    for (const name of present) {
      opts.signal?.throwIfAborted();
      const summary = await copyStream(js, jsm, name, out, opts.signal);
      streams.push(summary);
      opts.onStream?.(summary);
    }
    const messages = streams.reduce((n, s) => n + s.messages, 0);
    const bytes = streams.reduce((n, s) => n + s.bytes, 0);
    await out.write({ type: "done", streams: streams.length, messages, bytes });
    await out.close();
    await rename(partial, opts.file);
    return {
      file: opts.file,
      prefix: opts.prefix,
      createdAt,
      streams,
      messages,
      bytes,
      fileBytes: (await stat(opts.file)).size,
      ms: Date.now() - started,
    };
  } catch (err) {
    // A cut-short backup is of no use and holds jobs' inputs and outputs: it goes.
    await out.abort();
    await rm(partial, { force: true });
    throw err;
  }
}

/** Writes one stream's config line, its messages and its trailer. */
async function copyStream(
  js: JetStreamClient,
  jsm: JetStreamManager,
  name: string,
  out: LineWriter,
  signal: AbortSignal | undefined,
): Promise<StreamSummary> {
  const info = await jsm.streams.info(name);
  await out.write({ type: "stream", name, config: info.config, state: info.state, created: info.created });
  let copied = 0;
  let bytes = 0;
  let last = 0;
  if (info.state.messages > 0) {
    // A work queue takes no consumer that does not ack (and one that overlaps its pools' would be
    // refused): its messages, the jobs waiting, are read one by one instead.
    const messages =
      info.config.retention === RetentionPolicy.Workqueue
        ? gottenMessagesOf(jsm, name, info.state.first_seq, signal)
        : consumedMessagesOf(js, name, signal);
    for await (const msg of messages) {
      last = msg.seq;
      const line = messageLine(msg);
      copied += 1;
      bytes += msg.data.length + headerBytes(line.headers);
      await out.write(line);
    }
  }
  const summary = { stream: name, messages: copied, bytes, lastSeq: Math.max(info.state.last_seq, last) };
  await out.write({ type: "end", ...summary });
  return summary;
}

/** One stored message, however it was read. */
interface Stored {
  seq: number;
  subject: string;
  headers: MsgHdrs | undefined;
  data: Uint8Array;
  /** When it was stored, ISO 8601. */
  time: string;
}

/**
 * Every message of `stream` from its first, oldest first, through an ordered consumer (one
 * ephemeral consumer, flow-controlled, no acks), until it has caught up: a message that says
 * none is pending after it, or a second without any while the consumer has none pending.
 */
async function* consumedMessagesOf(js: JetStreamClient, stream: string, signal: AbortSignal | undefined): AsyncGenerator<Stored> {
  const consumer = await js.consumers.get(stream, { deliver_policy: DeliverPolicy.All });
  if ((await consumer.info()).num_pending === 0) return;
  const messages = await consumer.consume({ max_bytes: 4 * MiB });
  let last = 0;
  let lastAt = Date.now();
  // All that was left was removed before it was delivered: nothing more will come, and no
  // message will say so.
  const idle = setInterval(() => {
    if (Date.now() - lastAt < IDLE_CHECK_MS) return;
    consumer.info().then(
      (info) => {
        if (info.num_pending === 0 && info.delivered.stream_seq <= last) messages.stop();
      },
      () => {},
    );
  }, IDLE_CHECK_MS);
  const onAbort = () => messages.stop();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    for await (const msg of messages) {
      last = msg.seq;
      lastAt = Date.now();
      const time = new Date(msg.info.timestampNanos / 1e6).toISOString();
      yield { seq: msg.seq, subject: msg.subject, headers: msg.headers, data: msg.data, time };
      if (msg.info.pending === 0) break;
    }
    signal?.throwIfAborted();
  } finally {
    clearInterval(idle);
    signal?.removeEventListener("abort", onAbort);
    await messages.close().catch(() => {});
  }
}

/** Every message of `stream` from `from` to its end, one message get each (the next at or after a sequence). */
async function* gottenMessagesOf(
  jsm: JetStreamManager,
  stream: string,
  from: number,
  signal: AbortSignal | undefined,
): AsyncGenerator<Stored> {
  for (let seq = from; ; ) {
    signal?.throwIfAborted();
    const request = { seq, next_by_subj: ">" } as unknown as MsgRequest; // STREAM.MSG.GET takes it
    const stored = await jsm.streams.getMessage(stream, request);
    if (!stored) return;
    yield { seq: stored.seq, subject: stored.subject, headers: stored.header, data: stored.data, time: stored.time.toISOString() };
    seq = stored.seq + 1;
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

function messageLine(msg: Stored): MessageLine {
  const line: MessageLine = { seq: msg.seq, subject: msg.subject, time: msg.time };
  if (msg.headers) {
    const headers: Record<string, string[]> = {};
    for (const [key, values] of msg.headers) headers[key] = [...values];
    if (Object.keys(headers).length > 0) line.headers = headers;
  }
  try {
    line.text = utf8.decode(msg.data);
  } catch {
    line.base64 = Buffer.from(msg.data).toString("base64");
  }
  return line;
}
