/**
 * How much JetStream storage the system's limited streams (events, logs, dead letters, the
 * intake) and size-bounded buckets may reserve: what a single server has free for a new stream,
 * asked without making one; the sizes a refusal advises, checked to be accepted; and how far a
 * stream that exists is shrunk to the size a role is given. `openTopology` (topology.ts) decides
 * with these.
 */

import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { JetStreamApiError, type JetStreamManager, StorageType } from "@nats-io/jetstream";
import { isNotFound } from "./nats-errors.js";
import type { StreamSpec } from "./stream-placement.js";
import type { StreamLimits } from "./topology-options.js";

const MiB = 1024 ** 2;
/** JetStream's answer when the storage a stream asks for is more than the server or account has free. */
const INSUFFICIENT_STORAGE = 10047;
/** JetStream's answer to a stream whose subjects overlap another's. */
const SUBJECTS_OVERLAP = 10065;

/** The streams with a size limit, by their key in `StreamLimits`. */
export type LimitedStream = keyof StreamLimits;

/** What a limited stream that exists reserves (`maxBytes`, 0 for none) and holds (`bytes`). */
export interface StreamReservation {
  maxBytes: number;
  bytes: number;
}

/** True when JetStream refused a stream or bucket the storage it asks to reserve. */
export function isStorageRefusal(err: unknown): err is JetStreamApiError {
  return err instanceof JetStreamApiError && err.code === INSUFFICIENT_STORAGE;
}

/** Where to ask JetStream: a stream name the caller may create, and a subject an existing stream of this account takes. */
export interface ReservationProbe {
  name: string;
  overlapping: string;
}

/**
 * Whether JetStream would let a new stream reserve `bytes` now, asked without making one: a
 * create of `probe.name` whose subject overlaps an existing stream's. A single server checks
 * storage (the account's limit and its own `max_file_store`, less what streams reserve) before
 * subjects, so it answers "insufficient storage" when the size does not fit and "subjects
 * overlap" when it does, and makes nothing either way. Undefined when it answers anything else
 * (a cluster checks subjects first: do not ask there).
 */
export async function reservationFits(jsm: JetStreamManager, probe: ReservationProbe, bytes: number): Promise<boolean | undefined> {
  try {
    await jsm.streams.add({
      name: probe.name,
      subjects: [probe.overlapping],
      storage: StorageType.File,
      num_replicas: 1,
      max_bytes: bytes,
    });
  } catch (err) {
    if (err instanceof JetStreamApiError && err.code === INSUFFICIENT_STORAGE) return false;
    if (err instanceof JetStreamApiError && err.code === SUBJECTS_OVERLAP) return true;
    return undefined;
  }
  // Made after all (the overlapping stream went meanwhile): take it back, and say nothing.
  await jsm.streams.delete(probe.name).catch(() => {});
  return undefined;
}

/**
 * The most a new stream could reserve now, up to `upTo` bytes (below it, in whole MiB); undefined
 * when JetStream does not say (see `reservationFits`). One request when `upTo` fits, about a dozen
 * when it does not.
 */
export async function freeReservation(jsm: JetStreamManager, probe: ReservationProbe, upTo: number): Promise<number | undefined> {
  const all = await reservationFits(jsm, probe, upTo);
  if (all !== false) return all === undefined ? undefined : upTo;
  // `lo` MiB fits (none trivially), `hi` MiB does not.
  let lo = 0;
  let hi = Math.ceil(upTo / MiB);
  while (hi - lo > 1) {
    const mid = Math.floor((lo + hi) / 2);
    const fits = await reservationFits(jsm, probe, mid * MiB);
    if (fits === undefined) return undefined;
    if (fits) lo = mid;
    else hi = mid;
  }
  return lo * MiB;
}

/**
 * The size a stream that exists is shrunk to when a role is given `asked` for it: `asked`, or
 * what it holds (rounded up to a MiB) if more, since a shrink below that would drop messages
 * (waiting submissions, history). Undefined when it is left as it is: it reserves nothing (an
 * unlimited stream of an older release), or no more than that already.
 */
export function shrinkTarget(existing: StreamReservation, asked: number): number | undefined {
  if (existing.maxBytes <= 0 || asked >= existing.maxBytes) return undefined;
  const target = Math.max(asked, Math.ceil(existing.bytes / MiB) * MiB);
  return target < existing.maxBytes ? target : undefined;
}

/**
 * Whether a start given `limits` for every stream would be accepted: the streams that exist are
 * shrunk to them (`shrinkTarget`), and the ones missing must fit in what is free plus what the
 * shrinks release.
 */
export function wouldFit(
  limits: Required<StreamLimits>,
  free: number,
  existing: Partial<Record<LimitedStream, StreamReservation>>,
): boolean {
  let room = free;
  let needed = 0;
  for (const [stream, bytes] of Object.entries(limits) as [LimitedStream, number][]) {
    const there = existing[stream];
    if (there) room += there.maxBytes - (shrinkTarget(there, bytes) ?? there.maxBytes);
    else needed += bytes;
  }
  return needed <= room;
}

/**
 * Sizes for every limited stream that a start would accept (`wouldFit`), with half of the room
 * for the history streams (the other half is for jobs, which reserve nothing). First the missing
 * streams alone, scaled down alike into half of what is free, the existing ones keeping their
 * size; else every stream, into half of what is free and what the existing ones reserve (those
 * are shrunk then). Whole MiB, at least 1 MiB each, never more than asked. Undefined when not
 * even that fits.
 */
export function sizesThatFit(
  asked: Required<StreamLimits>,
  free: number,
  existing: Partial<Record<LimitedStream, StreamReservation>>,
): Required<StreamLimits> | undefined {
  // What each stream would keep as it is: the size asked, or the smaller one it has.
  const base = Object.fromEntries(
    (Object.entries(asked) as [LimitedStream, number][]).map(([stream, bytes]) => {
      const there = existing[stream]?.maxBytes ?? 0;
      return [stream, there > 0 ? Math.min(bytes, there) : bytes];
    }),
  ) as Required<StreamLimits>;
  const scaled = (streams: readonly LimitedStream[], budget: number): Required<StreamLimits> => {
    const total = streams.reduce((sum, stream) => sum + base[stream], 0);
    const sizes = { ...base };
    for (const stream of streams) {
      sizes[stream] = Math.min(base[stream], Math.max(MiB, Math.floor((base[stream] * budget) / total / MiB) * MiB));
    }
    return sizes;
  };
  const missing = (Object.keys(asked) as LimitedStream[]).filter((stream) => !existing[stream]);
  if (missing.length > 0 && free / 2 >= missing.length * MiB) {
    const sizes = scaled(missing, Math.floor(free / 2));
    if (wouldFit(sizes, free, existing)) return sizes;
  }
  const all = Object.keys(asked) as LimitedStream[];
  const reserved = Object.values(existing).reduce((sum, there) => sum + Math.max(0, there?.maxBytes ?? 0), 0);
  for (let budget = Math.floor((free + reserved) / 2); budget >= all.length * MiB; budget = Math.floor((budget * 3) / 4)) {
    const sizes = scaled(all, budget);
    if (wouldFit(sizes, free, existing)) return sizes;
  }
  return undefined;
}

/** A size as `--stream-limits` takes it: `1Gi`, `64Mi` (whole MiB, rounded down). */
export function sizeFlag(bytes: number): string {
  return bytes >= 1024 ** 3 && bytes % 1024 ** 3 === 0 ? `${bytes / 1024 ** 3}Gi` : `${Math.floor(bytes / MiB)}Mi`;
}

/** Limits as `--stream-limits` takes them: `events=64Mi,logs=32Mi,...`. */
export function limitsFlag(limits: StreamLimits): string {
  return Object.entries(limits)
    .map(([stream, bytes]) => `${stream}=${sizeFlag(bytes)}`)
    .join(",");
}

/** What a refused start measured and asked for, for its one line. */
export interface StorageShortfall {
  /** The sizes of the streams it was to create. */
  asked: StreamLimits;
  /** What JetStream had free for them; undefined when it could not be measured (a cluster). */
  free?: number | undefined;
  /** The sizes a start would be accepted with, when `free` was measured and they exist. */
  advice?: Required<StreamLimits> | undefined;
  /** Streams that exist and reserve storage, by name, with what they reserve. */
  reservedBy: ReadonlyArray<{ name: string; maxBytes: number }>;
  /** Streams it could not shrink to the size given, with why. */
  notShrunk: ReadonlyArray<{ name: string; reason: string }>;
  /** Streams it made and then removed again, or could not remove. */
  removed: readonly string[];
  leftBehind: ReadonlyArray<{ name: string; reason: string }>;
}

/** A start refused for want of storage, in one line: what it asked, what is free, sizes that would be accepted, and what it left. */
export function storageShortfallError(shortfall: StorageShortfall, cause?: unknown): BoxcarError {
  const askedTotal = Object.values(shortfall.asked).reduce((a, b) => a + b, 0);
  const parts = [
    `JetStream has less file storage free than Boxcar's streams reserve (${limitsFlag(shortfall.asked)}, ${sizeFlag(askedTotal)} in all, plus room for jobs)`,
  ];
  if (shortfall.free !== undefined) {
    const others = shortfall.reservedBy.map((s) => `${s.name} reserves ${sizeFlag(s.maxBytes)}`).join(", ");
    parts.push(`: ${sizeFlag(shortfall.free)} is free${others ? ` (${others})` : ""}`);
  }
  let fix =
    "give the server or account more (jetstream max_file_store, account limits) or reserve less with --stream-limits / BOXCAR_STREAM_LIMITS";
  if (shortfall.advice) fix += `, e.g. ${limitsFlag(shortfall.advice)} (half of what is free; the rest is room for jobs)`;
  else if (shortfall.free !== undefined) fix += ", or free storage first: not even 1Mi each fits";
  else fix += " (how much is free could not be measured here)";
  parts.push(`; ${fix}`);
  for (const s of shortfall.notShrunk) parts.push(`; ${s.name} could not be shrunk (${s.reason})`);
  if (shortfall.removed.length > 0) parts.push(`; the streams it had made are removed (${shortfall.removed.join(", ")})`);
  for (const s of shortfall.leftBehind) parts.push(`; ${s.name}, made by this start, could not be removed (${s.reason})`);
  return new BoxcarError(ErrorCode.storageFull, parts.join(""), { cause });
}

/** What `prepareLimitedStreams` is given: the streams as topology.ts asks for them, and how to measure. */
export interface LimitedStreamPlan {
  /** Each limited stream's configuration, its `max_bytes` the size asked (given, or the default). */
  specs: Record<LimitedStream, StreamSpec>;
  /** The sizes given (flag, environment, config file): a stream that exists is shrunk to these. */
  given: StreamLimits;
  /**
   * A subject an existing stream of the system takes, to ask what is free (`reservationFits`);
   * undefined where that cannot be asked without making a stream (a cluster).
   */
  overlapping?: string | undefined;
}

/** What `prepareLimitedStreams` found: the sizes of the streams to create, and a shortfall if they do not fit. */
export interface LimitedStreamsPrepared {
  missing: StreamLimits;
  shortfall?: StorageShortfall;
}

/**
 * Before the limited streams are created: shrinks each that exists to the size given for it (a
 * stream left by an earlier start, say; never below what it holds), then checks that the missing
 * ones fit in what JetStream has free, and when they do not, says so with sizes that would
 * (`sizesThatFit`). Creates nothing.
 */
export async function prepareLimitedStreams(jsm: JetStreamManager, plan: LimitedStreamPlan): Promise<LimitedStreamsPrepared> {
  const specs = Object.entries(plan.specs) as [LimitedStream, StreamSpec][];
  const existing: Partial<Record<LimitedStream, StreamReservation>> = {};
  const reservedBy: { name: string; maxBytes: number }[] = [];
  const notShrunk: { name: string; reason: string }[] = [];
  const infos = await Promise.all(
    specs.map(([, spec]) =>
      jsm.streams.info(spec.name).catch((err: unknown) => {
        if (isNotFound(err)) return undefined;
        throw err;
      }),
    ),
  );
  for (const [i, [stream, spec]] of specs.entries()) {
    const info = infos[i];
    if (!info) continue;
    const held = info.state.bytes;
    let maxBytes = Math.max(0, info.config.max_bytes ?? 0);
    const given = plan.given[stream];
    const target = given === undefined ? undefined : shrinkTarget({ maxBytes, bytes: held }, given);
    if (target !== undefined) {
      try {
        await jsm.streams.update(spec.name, { max_bytes: target });
        maxBytes = target;
      } catch (err) {
        notShrunk.push({ name: spec.name, reason: (err as Error).message });
      }
    }
    existing[stream] = { maxBytes, bytes: held };
    if (maxBytes > 0) reservedBy.push({ name: spec.name, maxBytes });
  }
  const missingSpecs = specs.filter(([stream]) => !existing[stream]);
  const missing: StreamLimits = Object.fromEntries(missingSpecs.map(([stream, spec]) => [stream, spec.max_bytes ?? 0]));
  const needed = Object.values(missing).reduce((a, b) => a + b, 0);
  const [first] = missingSpecs;
  if (!first || needed <= 0 || plan.overlapping === undefined) return { missing };
  const free = await freeReservation(jsm, { name: first[1].name, overlapping: plan.overlapping }, needed);
  if (free === undefined || free >= needed) return { missing };
  const asked = Object.fromEntries(specs.map(([stream, spec]) => [stream, spec.max_bytes ?? 0])) as Required<StreamLimits>;
  return {
    missing,
    shortfall: { asked: missing, free, advice: sizesThatFit(asked, free, existing), reservedBy, notShrunk, removed: [], leftBehind: [] },
  };
}

/** Removes streams a refused start made: what it removed, and what it could not (a role's credentials may not delete streams). */
export async function removeStreams(
  jsm: JetStreamManager,
  names: readonly string[],
): Promise<Pick<StorageShortfall, "removed" | "leftBehind">> {
  const removed: string[] = [];
  const leftBehind: { name: string; reason: string }[] = [];
  for (const name of names) {
    await jsm.streams.delete(name).then(
      () => removed.push(name),
      (err: unknown) => {
        if (isNotFound(err)) removed.push(name);
        else leftBehind.push({ name, reason: (err as Error).message });
      },
    );
  }
  return { removed, leftBehind };
}

/**
 * The size a bucket made on first use reserves: `asked`, or where a single server has less free
 * (`overlapping` given), a quarter of what it has (whole MiB, at least 1 MiB), so the buckets
 * after it fit too. Throws `storage_full` when not even 1 MiB is free.
 */
export async function bucketReservation(
  jsm: JetStreamManager,
  stream: string,
  asked: number,
  overlapping: string | undefined,
): Promise<number> {
  if (overlapping === undefined) return asked;
  const free = await freeReservation(jsm, { name: stream, overlapping }, asked);
  if (free === undefined || free >= asked) return asked;
  const share = Math.floor(free / 4 / MiB) * MiB;
  if (share >= MiB) return share;
  throw new BoxcarError(
    ErrorCode.storageFull,
    `JetStream has ${sizeFlag(free)} free to reserve, too little for ${stream}: give the server or account more (jetstream max_file_store, account limits), or shrink the history streams with --stream-limits`,
  );
}
