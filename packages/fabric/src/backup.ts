/**
 * A live, logical backup of everything one Boxcar system keeps in JetStream, and its restore onto
 * another NATS system (docs/backup.md).
 *
 * The backup is gzip'd JSON lines: a header, then for each stream of the prefix its config line,
 * its messages (sequence, subject, headers, data) oldest first, and a trailer with their count;
 * then a last line that says the file is complete. The restore makes each stream anew with its
 * saved config and publishes the messages again in order, at their original sequence numbers:
 * gaps (messages deleted before the backup) are filled with placeholders that are purged, so a KV
 * revision, a usage entry's event sequence or a client's `after` cursor still means what it meant.
 */

import { once } from "node:events";
import { createReadStream } from "node:fs";
import { type FileHandle, open, rename, rm, stat } from "node:fs/promises";
import { pipeline } from "node:stream/promises";
import { StringDecoder } from "node:string_decoder";
import { createGunzip, createGzip, type Gzip } from "node:zlib";
import { BoxcarError, ErrorCode, type Names, names as namesFor } from "@boxcar/protocol";
import {
  DeliverPolicy,
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
  type MsgRequest,
  RetentionPolicy,
  type StreamConfig,
  type StreamInfo,
} from "@nats-io/jetstream";
import { type MsgHdrs, type NatsConnection, headers as natsHeaders } from "@nats-io/transport-node";
import { z } from "zod";
import { isNotFound, isTransientNatsError } from "./nats-errors.js";

/** What the first line of every backup says it is. */
export const BACKUP_FORMAT = "boxcar-backup";
/** The version of the file's layout this release writes and reads. */
export const BACKUP_VERSION = 1;

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

/** A backup file that cannot be read, or is not one this release can restore; nothing was made. */
export class BackupFileError extends BoxcarError {
  override readonly name = "BackupFileError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(ErrorCode.invalid, message, options);
  }
}

/** A restore that failed part way: `made` are the streams it created, to delete before trying again. */
export class RestoreError extends BoxcarError {
  override readonly name = "RestoreError";
  constructor(
    code: ErrorCode,
    message: string,
    readonly made: readonly string[],
    options?: { cause?: unknown },
  ) {
    super(code, message, options);
  }
}

const MiB = 1024 * 1024;
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

interface MessageLine {
  seq: number;
  subject: string;
  /** When the message was stored at the source (a restored one is stored anew, at the restore's time). */
  time: string;
  headers?: Record<string, string[]>;
  /** The data, when it is UTF-8 text (JSON records, events, logs). */
  text?: string;
  /** The data otherwise (file chunks), base64. */
  base64?: string;
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

function headerBytes(headers: Record<string, string[]> | undefined): number {
  let n = 0;
  for (const [key, values] of Object.entries(headers ?? {})) for (const v of values) n += key.length + v.length + 4;
  return n;
}

/** Gzip'd JSON lines to a file made with mode 0600, with backpressure. */
class LineWriter {
  private failure: unknown;

  private constructor(
    private readonly gzip: Gzip,
    private readonly done: Promise<void>,
  ) {
    done.catch((err: unknown) => {
      this.failure = err;
    });
  }

  static async open(path: string): Promise<LineWriter> {
    // A file left by an earlier cut-short run may have another mode: start afresh.
    await rm(path, { force: true });
    let handle: FileHandle;
    try {
      handle = await open(path, "wx", 0o600);
    } catch (err) {
      throw new BackupFileError(`cannot write ${path}: ${(err as Error).message}`, { cause: err });
    }
    const gzip = createGzip();
    return new LineWriter(gzip, pipeline(gzip, handle.createWriteStream()));
  }

  async write(value: object): Promise<void> {
    if (this.failure) throw this.failure;
    if (!this.gzip.write(`${JSON.stringify(value)}\n`)) await once(this.gzip, "drain");
  }

  async close(): Promise<void> {
    this.gzip.end();
    await this.done;
  }

  async abort(): Promise<void> {
    this.gzip.destroy();
    await this.done.catch(() => {});
  }
}

async function streamInfo(jsm: JetStreamManager, name: string): Promise<StreamInfo | undefined> {
  try {
    return await jsm.streams.info(name);
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

// ---------------------------------------------------------------------------------------------
// Reading a backup

const Header = z.object({
  format: z.literal(BACKUP_FORMAT),
  version: z.number(),
  prefix: z.string(),
  createdAt: z.string(),
  streams: z.array(z.string()),
});
const StreamLine = z.object({
  type: z.literal("stream"),
  name: z.string(),
  config: z.looseObject({ name: z.string(), subjects: z.array(z.string()) }),
  state: z.looseObject({ first_seq: z.number(), last_seq: z.number(), messages: z.number() }),
});
const HEADER_NAME = /^[!-9;-~]+$/;
const Message = z
  .object({
    seq: z.number().int().positive(),
    subject: z.string().regex(/^[^\s]+$/),
    time: z.string().optional(),
    headers: z.record(z.string().regex(HEADER_NAME), z.array(z.string().regex(/^[^\r\n]*$/))).optional(),
    text: z.string().optional(),
    base64: z
      .string()
      .regex(/^[A-Za-z0-9+/]*={0,2}$/)
      .optional(),
  })
  .refine((m) => (m.text === undefined) !== (m.base64 === undefined), "a message has its data as text or as base64");
const EndLine = z.object({
  type: z.literal("end"),
  stream: z.string(),
  messages: z.number().int().nonnegative(),
  bytes: z.number().nonnegative(),
  lastSeq: z.number().int().nonnegative(),
});
const DoneLine = z.object({
  type: z.literal("done"),
  streams: z.number().int().nonnegative(),
  messages: z.number().int().nonnegative(),
  bytes: z.number().nonnegative(),
});
type Message = z.infer<typeof Message>;

/** One stream as a backup holds it, checked. */
export interface PlannedStream {
  name: string;
  kind: SystemStream["kind"];
  subjects: readonly string[];
  config: Record<string, unknown>;
  /** Its first message's sequence; `lastSeq + 1` when it has none. */
  firstSeq: number;
  lastSeq: number;
  messages: number;
  bytes: number;
  /** How many messages the stream holds once they are all published again (its limits per subject and rollups applied). */
  kept: number;
}

/** A backup file, read through once and checked, ready to restore. */
export interface BackupPlan {
  file: string;
  prefix: string;
  createdAt: string;
  streams: PlannedStream[];
  messages: number;
}

/** The longest line a backup may have: a 1 MiB message in base64 with headers, and room to spare. */
const MAX_LINE = 16 * MiB;

/** The lines of a gzip'd file, with their numbers; a file that is not gzip, is cut short or corrupt is a `BackupFileError`. */
async function* linesOf(file: string): AsyncGenerator<{ n: number; text: string }> {
  let magic: Buffer;
  try {
    const handle = await open(file, "r");
    try {
      magic = Buffer.alloc(2);
      const { bytesRead } = await handle.read(magic, 0, 2, 0);
      magic = magic.subarray(0, bytesRead);
    } finally {
      await handle.close();
    }
  } catch (err) {
    throw new BackupFileError(`cannot read ${file}: ${(err as Error).message}`, { cause: err });
  }
  if (magic.length < 2 || magic[0] !== 0x1f || magic[1] !== 0x8b) {
    throw new BackupFileError(`${file} is not a Boxcar backup: it is not gzip data (boxcar backup writes gzip'd JSON lines)`);
  }
  const source = createReadStream(file);
  const gunzip = createGunzip();
  source.on("error", (err) => gunzip.destroy(err));
  source.pipe(gunzip);
  const decoder = new StringDecoder("utf8");
  let rest = "";
  let n = 0;
  try {
    for await (const chunk of gunzip) {
      rest += decoder.write(chunk as Buffer);
      const lines = rest.split("\n");
      rest = lines.pop() ?? "";
      for (const text of lines) {
        n += 1;
        yield { n, text };
      }
      if (rest.length > MAX_LINE) throw new BackupFileError(`${file} is corrupt: line ${n + 1} is longer than ${MAX_LINE} characters`);
    }
  } catch (err) {
    if (err instanceof BackupFileError) throw err;
    const code = (err as { code?: string }).code;
    if (code === "Z_BUF_ERROR" || /unexpected end of file/i.test((err as Error).message)) {
      throw new BackupFileError(
        `${file} is truncated: its compressed data ends early (the backup was cut short, or the copy is incomplete)`,
        {
          cause: err,
        },
      );
    }
    if (code?.startsWith("Z_")) throw new BackupFileError(`${file} is corrupt: ${(err as Error).message}`, { cause: err });
    throw new BackupFileError(`cannot read ${file}: ${(err as Error).message}`, { cause: err });
  } finally {
    source.destroy();
  }
  rest += decoder.end();
  if (rest !== "") throw new BackupFileError(`${file} is truncated: its last line (${n + 1}) is incomplete`);
}

/** Parses one line as JSON, or says which line of which file is not. */
function parseLine(file: string, n: number, text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new BackupFileError(`${file} is corrupt: line ${n} is not JSON`);
  }
}

function checked<T>(schema: z.ZodType<T>, value: unknown, file: string, n: number, what: string): T {
  const parsed = schema.safeParse(value);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  throw new BackupFileError(`${file} is corrupt: line ${n} is not a valid ${what} (${issue?.path.join(".") || "line"}: ${issue?.message})`);
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

/** The subject the placeholders for missing sequences go to: one no Boxcar message uses. */
function gapSubject(stream: PlannedStream): string {
  return (stream.subjects[0] as string).replace(/>$/, "~boxcar-restore-gap");
}

/**
 * Reads a backup through once and checks all of it: that it is a complete backup of this format
 * version, of `prefix`, of streams of that prefix only, each with the subjects its kind has, each
 * message on one of its stream's subjects, in order, and the counts its trailers give. Holds no
 * message in memory (a count per subject, for streams with a limit per subject).
 */
export async function readBackupPlan(file: string, prefix: string): Promise<BackupPlan> {
  const known = new Map(systemStreams(prefix).map((s) => [s.name, s]));
  let header: z.infer<typeof Header> | undefined;
  const streams: PlannedStream[] = [];
  let current:
    | { plan: PlannedStream; lastSeen: number; counts: Map<string, number> | undefined; perSubject: number; rollups: boolean }
    | undefined;
  let done: z.infer<typeof DoneLine> | undefined;
  let total = 0;
  for await (const { n, text } of linesOf(file)) {
    const value = parseLine(file, n, text);
    if (n === 1) {
      const v = value as { format?: unknown; version?: unknown; prefix?: unknown };
      if (typeof value !== "object" || value === null || v.format !== BACKUP_FORMAT) {
        throw new BackupFileError(`${file} is not a Boxcar backup: its first line does not say format ${JSON.stringify(BACKUP_FORMAT)}`);
      }
      if (v.version !== BACKUP_VERSION) {
        throw new BackupFileError(
          `${file} is a backup in format version ${JSON.stringify(v.version)}; this boxcar reads version ${BACKUP_VERSION} only`,
        );
      }
      header = checked(Header, value, file, n, "header");
      if (header.prefix !== prefix) {
        throw new BackupFileError(
          `${file} is a backup of the system with prefix ${header.prefix}, not ${prefix}: restore it with --prefix ${header.prefix}`,
        );
      }
      continue;
    }
    if (done) throw new BackupFileError(`${file} is corrupt: line ${n} comes after the line that ends the backup`);
    const type = typeof value === "object" && value !== null ? (value as { type?: unknown }).type : undefined;
    if (type === "stream") {
      if (current) throw new BackupFileError(`${file} is corrupt: line ${n} starts a stream before ${current.plan.name} ended`);
      const line = checked(StreamLine, value, file, n, "stream line");
      const system = known.get(line.name);
      if (!system) {
        throw new BackupFileError(
          `${file} holds a stream ${line.name}, which is not one of a Boxcar system with prefix ${prefix}: refused`,
        );
      }
      if (streams.some((s) => s.name === line.name)) throw new BackupFileError(`${file} is corrupt: it holds stream ${line.name} twice`);
      const subjects = [...line.config.subjects].sort();
      if (line.config.name !== line.name || subjects.join(" ") !== [...system.subjects].sort().join(" ")) {
        throw new BackupFileError(
          `${file} gives stream ${line.name} the subjects ${line.config.subjects.join(", ")}; a Boxcar system's has ${system.subjects.join(", ")}: refused`,
        );
      }
      for (const field of ["mirror", "sources"] as const) {
        if (line.config[field])
          throw new BackupFileError(`${file} gives stream ${line.name} a ${field}: a Boxcar stream has none; refused`);
      }
      const perSubject = Number(line.config.max_msgs_per_subject ?? 0);
      const rollups = line.config.allow_rollup_hdrs === true;
      current = {
        plan: {
          name: line.name,
          kind: system.kind,
          subjects: system.subjects,
          config: line.config,
          firstSeq: 0,
          lastSeq: 0,
          messages: 0,
          bytes: 0,
          kept: 0,
        },
        lastSeen: 0,
        counts: perSubject > 0 || rollups ? new Map() : undefined,
        perSubject,
        rollups,
      };
      continue;
    }
    if (!current) {
      if (type === "done") {
        done = checked(DoneLine, value, file, n, "closing line");
        continue;
      }
      throw new BackupFileError(`${file} is corrupt: line ${n} is not a stream's first line`);
    }
    if (type === "end") {
      const end = checked(EndLine, value, file, n, "stream trailer");
      const plan = current.plan;
      if (end.stream !== plan.name || end.messages !== plan.messages || end.lastSeq < current.lastSeen) {
        throw new BackupFileError(
          `${file} is corrupt: stream ${plan.name} has ${plan.messages} messages up to sequence ${current.lastSeen}, its trailer says ${end.messages} up to ${end.lastSeq}`,
        );
      }
      plan.lastSeq = end.lastSeq;
      if (plan.messages === 0) plan.firstSeq = end.lastSeq + 1;
      streams.push(plan);
      current = undefined;
      continue;
    }
    if (type !== undefined) throw new BackupFileError(`${file} is corrupt: line ${n} has an unknown type ${JSON.stringify(type)}`);
    const msg = checked(Message, value, file, n, "message");
    const plan = current.plan;
    if (msg.seq <= current.lastSeen) {
      throw new BackupFileError(`${file} is corrupt: line ${n} has sequence ${msg.seq} after ${current.lastSeen} in stream ${plan.name}`);
    }
    if (!plan.subjects.some((f) => subjectMatches(f, msg.subject)) || msg.subject === gapSubject(plan)) {
      throw new BackupFileError(
        `${file} holds a message on ${msg.subject} in stream ${plan.name}, which does not take that subject: refused`,
      );
    }
    if (plan.messages === 0) plan.firstSeq = msg.seq;
    current.lastSeen = msg.seq;
    plan.messages += 1;
    plan.bytes += dataOf(msg).length + headerBytes(msg.headers);
    total += 1;
    keep(current, msg);
  }
  if (!header) throw new BackupFileError(`${file} is not a Boxcar backup: it is empty`);
  if (current || !done) {
    throw new BackupFileError(
      `${file} is truncated: it ends ${current ? `inside stream ${current.plan.name}` : "before the line that closes a complete backup"}`,
    );
  }
  if (done.streams !== streams.length || done.messages !== total) {
    throw new BackupFileError(
      `${file} is corrupt: it holds ${streams.length} streams and ${total} messages, its last line says ${done.streams} and ${done.messages}`,
    );
  }
  if (header.streams.join(" ") !== streams.map((s) => s.name).join(" ")) {
    throw new BackupFileError(`${file} is corrupt: its header lists other streams (${header.streams.join(", ")}) than it holds`);
  }
  const work = namesFor(prefix).streams.work;
  if (!streams.some((s) => s.name === work)) throw new BackupFileError(`${file} has no ${work} stream: it is not a whole system's backup`);
  return { file, prefix, createdAt: header.createdAt, streams, messages: total };
}

/** Counts what a stream keeps of `msg` and what came before: its limit per subject, and rollups, as JetStream applies them. */
function keep(
  current: { plan: PlannedStream; counts: Map<string, number> | undefined; perSubject: number; rollups: boolean },
  msg: Message,
) {
  const { plan, counts } = current;
  if (!counts) {
    plan.kept += 1;
    return;
  }
  const rollup = current.rollups ? headerOf(msg, "Nats-Rollup")?.toLowerCase() : undefined;
  if (rollup === "all") {
    counts.clear();
    plan.kept = 0;
  } else if (rollup === "sub") {
    plan.kept -= counts.get(msg.subject) ?? 0;
    counts.delete(msg.subject);
  }
  const count = (counts.get(msg.subject) ?? 0) + 1;
  plan.kept += 1;
  if (current.perSubject > 0 && count > current.perSubject) {
    plan.kept -= 1;
    counts.set(msg.subject, current.perSubject);
  } else counts.set(msg.subject, count);
}

function headerOf(msg: Message, name: string): string | undefined {
  const key = Object.keys(msg.headers ?? {}).find((k) => k.toLowerCase() === name.toLowerCase());
  return key ? msg.headers?.[key]?.[0] : undefined;
}

function dataOf(msg: Message): Uint8Array {
  return msg.text !== undefined ? Buffer.from(msg.text, "utf8") : Buffer.from(msg.base64 ?? "", "base64");
}

// ---------------------------------------------------------------------------------------------
// Restoring

export interface RestoreOptions {
  prefix: string;
  file: string;
  /** Replicas of every stream; default: what a new system on this NATS system gets (3 on a cluster that can place them, else 1). */
  replicas?: number;
  signal?: AbortSignal;
  /** Called once the file is checked, before anything is made. */
  onPlan?: (plan: BackupPlan) => void;
  /** Called as each stream is restored and checked. */
  onStream?: (summary: RestoredStream) => void;
}

/** What one stream's restore came to. */
export interface RestoredStream extends StreamSummary {
  replicas: number;
  /** Sequences the source had deleted, filled by placeholders (then purged) to keep the others' numbers. */
  filled: number;
}

export interface RestoreSummary {
  file: string;
  prefix: string;
  /** When the backup was made. */
  createdAt: string;
  replicas: number;
  streams: RestoredStream[];
  messages: number;
  /** How long reading the file through and checking it took, before anything was made. */
  checkMs: number;
  ms: number;
}

/**
 * The headers JetStream reads as conditions of one publish (`Nats-Expected-*`: the source's
 * sequences would not match) or of a batch: not sent again. `Nats-Msg-Id` is (work recovery
 * reads it from stored items; see `Publisher` for duplicates), and so are `Nats-Rollup` (a KV
 * purge or an object's metadata replays as it ran) and `KV-Operation`.
 */
const NOT_REPLAYED = /^nats-(expected-|batch-)/i;
/** The duplicate window a stream has while it is restored (ns): a message id seen again after it is a message of its own. */
const RESTORE_DUPLICATE_WINDOW_NS = 100_000_000;
/** How many publishes are in flight at once. */
const IN_FLIGHT = 512;
/** After how many placeholders they are purged, so they never take much of a stream's room. */
const GAP_PURGE_EVERY = 5_000;

/** The config fields a restored stream takes from its backup; placement, mirrors, sources and republishing are left out. */
const KEPT_CONFIG = [
  "description",
  "subjects",
  "retention",
  "max_consumers",
  "max_msgs",
  "max_bytes",
  "max_age",
  "max_msgs_per_subject",
  "max_msg_size",
  "discard",
  "discard_new_per_subject",
  "storage",
  "no_ack",
  "duplicate_window",
  "allow_rollup_hdrs",
  "deny_delete",
  "deny_purge",
  "allow_direct",
  "compression",
  "consumer_limits",
  "allow_msg_ttl",
  "subject_delete_marker_ttl",
] as const;

/** A stream's config as it is to end up on the target (no placement, `replicas` replicas). */
function targetConfig(stream: PlannedStream, replicas: number): Partial<StreamConfig> & { name: string } {
  const config: Record<string, unknown> = { name: stream.name };
  for (const key of KEPT_CONFIG) if (stream.config[key] !== undefined) config[key] = stream.config[key];
  const metadata = Object.entries((stream.config.metadata ?? {}) as Record<string, string>).filter(([k]) => !k.startsWith("_nats"));
  if (metadata.length > 0) config.metadata = Object.fromEntries(metadata);
  config.subjects = [...stream.subjects];
  config.num_replicas = replicas;
  // With several replicas a direct get may be answered by a follower behind the leader: a new
  // system's buckets read from the leader then (see openTopology), and so do restored ones.
  if (stream.kind === "kv") config.allow_direct = replicas === 1;
  return config as Partial<StreamConfig> & { name: string };
}

/**
 * Restores a backup onto this NATS system: checks the whole file first (`readBackupPlan`), refuses
 * if any stream of the prefix exists here already, then makes each stream with its saved config and
 * publishes its messages again, in order and at their sequences, and checks what each holds. A
 * failure part way is a `RestoreError` that names the streams made.
 */
export async function restoreSystem(nc: NatsConnection, opts: RestoreOptions): Promise<RestoreSummary> {
  const started = Date.now();
  const plan = await readBackupPlan(opts.file, opts.prefix);
  const checkMs = Date.now() - started;
  opts.onPlan?.(plan);
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const existing: string[] = [];
  for (const stream of systemStreams(opts.prefix)) if (await streamInfo(jsm, stream.name)) existing.push(stream.name);
  if (existing.length > 0) {
    throw new BoxcarError(
      ErrorCode.conflict,
      `this NATS system already has a Boxcar system with prefix ${opts.prefix} (streams ${existing.join(", ")}): a restore makes every stream anew; restore onto a NATS system without them, or delete them first`,
    );
  }
  const made: string[] = [];
  const restored: RestoreSummary["streams"] = [];
  let replicas = opts.replicas;
  let at: { stream: string; published: number } | undefined;
  try {
    // The first stream settles the replica count; the others are made together (each takes a
    // cluster a moment to place), before any message is published.
    const [first, ...rest] = plan.streams as [PlannedStream, ...PlannedStream[]];
    if (replicas === undefined) replicas = await createChoosingReplicas(nc, jsm, first);
    else await createStream(jsm, nc, first, replicas);
    made.push(first.name);
    const count = replicas;
    const results = await Promise.allSettled(
      rest.map(async (stream) => {
        await createStream(jsm, nc, stream, count);
        made.push(stream.name);
      }),
    );
    made.sort((a, b) => plan.streams.findIndex((s) => s.name === a) - plan.streams.findIndex((s) => s.name === b));
    const refused = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (refused) throw refused.reason;

    const planned = new Map(plan.streams.map((s) => [s.name, s]));
    let stream: PlannedStream | undefined;
    let publisher: Publisher | undefined;
    for await (const { n, text } of linesOf(opts.file)) {
      opts.signal?.throwIfAborted();
      if (n === 1) continue;
      const value = parseLine(opts.file, n, text) as { type?: string; name?: string };
      if (value.type === "stream") {
        stream = planned.get(value.name ?? "");
        if (!stream) throw new BackupFileError(`${opts.file} changed while it was restored (line ${n})`);
        at = { stream: stream.name, published: 0 };
        publisher = new Publisher(js, jsm, stream);
        continue;
      }
      if (!stream || !publisher || !at) continue; // the closing line
      if (value.type === "end") {
        await publisher.finish();
        await finishStream(jsm, stream);
        const summary = {
          stream: stream.name,
          messages: stream.messages,
          bytes: stream.bytes,
          lastSeq: stream.lastSeq,
          replicas: count,
          filled: publisher.filled,
        };
        restored.push(summary);
        opts.onStream?.(summary);
        stream = undefined;
        publisher = undefined;
        continue;
      }
      const msg = checked(Message, value, opts.file, n, "message");
      await publisher.publish(msg);
      at.published += 1;
    }
    if (restored.length !== plan.streams.length) throw new BackupFileError(`${opts.file} changed while it was restored`);
  } catch (err) {
    if (made.length === 0 && (err instanceof BackupFileError || (err instanceof BoxcarError && err.code !== ErrorCode.internal))) throw err;
    const where = at ? ` at stream ${at.stream} (${at.published} messages published)` : "";
    const cause = err instanceof Error ? err.message : String(err);
    // JetStream refusing what the backup asks (a message over a limit, say) is a refusal (exit 3), not a crash.
    const code = opts.signal?.aborted
      ? ErrorCode.cancelled
      : isTransientNatsError(err)
        ? ErrorCode.unavailable
        : err instanceof BoxcarError
          ? err.code
          : err instanceof JetStreamApiError
            ? ErrorCode.invalid
            : ErrorCode.internal;
    throw new RestoreError(
      code,
      made.length === 0
        ? `restore failed${where} before any stream was made: ${cause}`
        : `restore failed${where}: ${cause}. It made ${made.length} of ${plan.streams.length} streams: ${made.join(", ")}; delete them (nats stream rm NAME) before restoring again`,
      made,
      { cause: err },
    );
  }
  return {
    file: opts.file,
    prefix: opts.prefix,
    createdAt: plan.createdAt,
    replicas: replicas ?? 1,
    streams: restored,
    messages: plan.messages,
    checkMs,
    ms: Date.now() - started,
  };
}

/** JetStream's refusals of a replica count this NATS system cannot hold (as `openTopology` reads them). */
const REPLICA_REFUSALS: readonly number[] = [10005, 10023, 10074];
const INSUFFICIENT_STORAGE = 10047;
/** How long a replica count that was asked for is tried while a new cluster's servers join (as `openTopology`). */
const ASKED_PLACEMENT_PATIENCE_MS = 60_000;

const isReplicaRefusal = (err: unknown): err is JetStreamApiError =>
  err instanceof JetStreamApiError && REPLICA_REFUSALS.includes(err.code);

/**
 * Makes the first stream the way `openTopology` makes a new system's work stream without a replica
 * count asked for: 3 replicas when this server is in a JetStream cluster that can place them
 * (tried for 5 s, or 60 s when the server advertises 3 or more client URLs), else 1.
 */
async function createChoosingReplicas(nc: NatsConnection, jsm: JetStreamManager, stream: PlannedStream): Promise<number> {
  if (nc.info?.cluster && nc.info.jetstream) {
    const patience = (nc.info.connect_urls?.length ?? 0) >= 3 ? ASKED_PLACEMENT_PATIENCE_MS : 5_000;
    if (await tryCreate(jsm, targetConfig(stream, 3), stream.firstSeq, patience)) return 3;
  }
  await createStream(jsm, nc, stream, 1);
  return 1;
}

async function createStream(jsm: JetStreamManager, nc: NatsConnection, stream: PlannedStream, replicas: number): Promise<void> {
  const patience = replicas > 1 && nc.info?.cluster ? ASKED_PLACEMENT_PATIENCE_MS : 0;
  if (!(await tryCreate(jsm, targetConfig(stream, replicas), stream.firstSeq, patience))) {
    throw new BoxcarError(
      ErrorCode.unavailable,
      `JetStream cannot keep ${replicas} replicas of ${stream.name} here: it needs as many servers with JetStream up in one cluster; use --replicas 1 on a single server`,
    );
  }
}

/** Creates the stream as it is while restored; false when JetStream keeps refusing its replica count for `patienceMs`. */
async function tryCreate(
  jsm: JetStreamManager,
  config: Partial<StreamConfig> & { name: string },
  firstSeq: number,
  patienceMs: number,
): Promise<boolean> {
  const restoring: Partial<StreamConfig> & { name: string } = {
    ...config,
    // Not yet: a message id seen again in the backup is a message of its own; and placeholders are purged.
    duplicate_window: RESTORE_DUPLICATE_WINDOW_NS,
    deny_delete: false,
    deny_purge: false,
    ...(firstSeq > 1 ? { first_seq: firstSeq } : {}),
  };
  const deadline = Date.now() + patienceMs;
  for (;;) {
    try {
      await jsm.streams.add(restoring);
      return true;
    } catch (err) {
      if (err instanceof JetStreamApiError && err.code === INSUFFICIENT_STORAGE) {
        throw new BoxcarError(
          ErrorCode.storageFull,
          `JetStream has less storage free than stream ${config.name} reserves (max_bytes ${config.max_bytes}): give the server or account more`,
          { cause: err },
        );
      }
      // One replica refused is not about replicas (a single server short of resources, say).
      if (!isReplicaRefusal(err) || config.num_replicas === 1) throw err;
      if (Date.now() + 500 > deadline) return false;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

/** Gives a restored stream its saved duplicate window and deletion settings, and checks what it holds. */
async function finishStream(jsm: JetStreamManager, stream: PlannedStream): Promise<void> {
  const info = await jsm.streams.info(stream.name);
  const saved = stream.config;
  const update: Partial<StreamConfig> = {};
  for (const key of ["duplicate_window", "deny_delete", "deny_purge"] as const) {
    if (saved[key] !== undefined && saved[key] !== info.config[key]) (update as Record<string, unknown>)[key] = saved[key];
  }
  if (Object.keys(update).length > 0) {
    const { first_seq: _first, ...config } = info.config as StreamConfig & { first_seq?: number };
    await jsm.streams.update(stream.name, { ...config, ...update });
  }
  const { state } = info;
  if (state.last_seq !== stream.lastSeq || state.messages !== stream.kept) {
    throw new BoxcarError(
      ErrorCode.internal,
      `stream ${stream.name} holds ${state.messages} messages up to sequence ${state.last_seq} once restored; the backup makes it ${stream.kept} up to ${stream.lastSeq}`,
    );
  }
}

/**
 * Publishes one stream's messages again, several in flight, each checked to be stored at its
 * original sequence; missing sequences are filled with placeholders (on `gapSubject`) that are
 * purged. A message whose id (`Nats-Msg-Id`) was published less than a second before (the same id
 * twice in a backup: the source stored the second after its window) waits for the restore's short
 * duplicate window to pass, so it is stored and not dropped as a duplicate.
 */
class Publisher {
  private readonly inFlight: Promise<void>[] = [];
  private failure: unknown;
  private next: number;
  private gapsSincePurge = 0;
  /** How many placeholders it published. */
  filled = 0;
  private readonly recentIds = new Map<string, number>();
  private readonly gap: string;

  constructor(
    private readonly js: JetStreamClient,
    private readonly jsm: JetStreamManager,
    private readonly stream: PlannedStream,
  ) {
    this.next = stream.firstSeq;
    this.gap = gapSubject(stream);
  }

  async publish(msg: Message): Promise<void> {
    // Checked again: the file could have changed since it was read through.
    if (msg.seq < this.next || msg.seq > this.stream.lastSeq || !this.stream.subjects.some((f) => subjectMatches(f, msg.subject))) {
      throw new BackupFileError(
        `the backup changed while it was restored: stream ${this.stream.name} has a message it did not have at sequence ${msg.seq}`,
      );
    }
    while (this.next < msg.seq) await this.send(this.gap, new Uint8Array(0), undefined, this.next, true);
    const hdrs = natsHeaders();
    let id: string | undefined;
    let any = false;
    for (const [key, values] of Object.entries(msg.headers ?? {})) {
      if (NOT_REPLAYED.test(key)) continue;
      for (const v of values) {
        hdrs.append(key, v);
        any = true;
      }
      if (key.toLowerCase() === "nats-msg-id") id = values[0];
    }
    if (id !== undefined) await this.clearId(id);
    await this.send(msg.subject, dataOf(msg), any ? hdrs : undefined, msg.seq, false);
  }

  /** Publishes the placeholders up to the stream's last sequence, waits for every ack, and purges the placeholders. */
  async finish(): Promise<void> {
    while (this.next <= this.stream.lastSeq) await this.send(this.gap, new Uint8Array(0), undefined, this.next, true);
    await this.flush();
    if (this.filled > 0) await this.jsm.streams.purge(this.stream.name, { filter: this.gap });
  }

  private async send(subject: string, data: Uint8Array, hdrs: ReturnType<typeof natsHeaders> | undefined, seq: number, gap: boolean) {
    if (this.failure) throw this.failure;
    if (this.inFlight.length >= IN_FLIGHT) await this.inFlight.shift();
    if (this.failure) throw this.failure;
    const sent = this.js.publish(subject, data, { timeout: 30_000, ...(hdrs ? { headers: hdrs } : {}) }).then((ack) => {
      if (ack.duplicate)
        throw new Error(`${this.stream.name}: the message at sequence ${seq} was dropped as a duplicate of an earlier one`);
      if (ack.seq !== seq) throw new Error(`${this.stream.name}: the message at sequence ${seq} was stored at ${ack.seq}`);
    });
    this.inFlight.push(
      sent.catch((err: unknown) => {
        this.failure ??= err;
      }),
    );
    this.next = seq + 1;
    if (gap) {
      this.filled += 1;
      this.gapsSincePurge += 1;
      if (this.gapsSincePurge >= GAP_PURGE_EVERY) {
        this.gapsSincePurge = 0;
        await this.flush();
        await this.jsm.streams.purge(this.stream.name, { filter: this.gap });
      }
    }
  }

  private async flush(): Promise<void> {
    while (this.inFlight.length > 0) await this.inFlight.shift();
    if (this.failure) throw this.failure;
  }

  /** Waits, when `id` was published within the last second, until the stream would no longer drop it as a duplicate. */
  private async clearId(id: string): Promise<void> {
    const now = Date.now();
    for (const [old, at] of this.recentIds) {
      if (now - at < 1_000) break;
      this.recentIds.delete(old);
    }
    const seen = this.recentIds.get(id);
    if (seen !== undefined) {
      await this.flush();
      await new Promise((r) => setTimeout(r, Math.max(0, seen + 1_000 - Date.now())));
      this.recentIds.delete(id);
    }
    this.recentIds.set(id, Date.now());
  }
}
