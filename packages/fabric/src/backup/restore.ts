/**
 * Restoring a backup onto another NATS system (`boxcar restore`, docs/backup.md): `restoreSystem`
 * checks the whole file first (`readBackupPlan`), then makes each stream anew with its saved config
 * and publishes the messages again in order, at their original sequence numbers: gaps (messages
 * deleted before the backup) are filled with placeholders that are purged, so a KV revision, a usage
 * entry's event sequence or a client's `after` cursor still means what it meant. A restore that
 * fails part way is a `RestoreError` that names the streams it made.
 */

import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import {
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
  type StreamConfig,
} from "@nats-io/jetstream";
import { type NatsConnection, headers as natsHeaders } from "@nats-io/transport-node";
import { isTransientNatsError } from "../nats-errors.js";
import { BackupFileError, checked, dataOf, linesOf, Message, parseLine } from "./format.js";
import { type BackupPlan, gapSubject, type PlannedStream, readBackupPlan } from "./plan.js";
import { type StreamSummary, streamInfo, subjectMatches, systemStreams } from "./streams.js";

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
