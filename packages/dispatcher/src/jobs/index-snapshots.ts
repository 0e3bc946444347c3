import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import type { ObjectStore } from "@nats-io/obj";
import { Sweep } from "../loops/sweep.js";
import { decodeImage, encodeImage } from "./index-image.js";
import type { JobIndex } from "./job-index.js";

/** Where a start from a snapshot goes on from: the records after `seq`, and the unsettled jobs' records. */
export interface StartingPoint {
  /** The jobs bucket's last sequence the snapshot reflects. */
  seq: number;
  /** The jobs it holds no entry of (not ended, or with something left to do): their records are read again. */
  unsettled: string[];
  /** The jobs bucket's delete markers still to remove when it was written (each key and sequence). */
  markers: [string, number][];
  /** How many settled jobs it gave the index. */
  settled: number;
  /** Its size, and the time taken to read it and to give the index its jobs, in ms. */
  bytes: number;
  readMs: number;
  restoreMs: number;
}

/** What names a snapshot: the jobs bucket's stream it was cut from (its creation time) and its sequence then. */
interface Cut {
  name: string;
  seq: number;
  created: string;
}

/** What a snapshot's header keeps besides the image. */
interface Meta extends Cut {
  markers: [string, number][];
}

/** What the store holds: the snapshots of the jobs stream as it is now (oldest first, each with when it was written), the leases, and the rest. */
interface Listing {
  store: ObjectStore;
  stream: { created: string; lastSeq: number };
  cuts: (Cut & { writtenAt: number })[];
  leases: { name: string; seq: number; until: number }[];
  /** Every object's name. */
  names: string[];
}

/**
 * The job index's snapshots, in the dispatchers' own Object Store (docs/operations.md, "Start-up
 * at a million jobs"): every `intervalMs`, a dispatcher whose watch has moved past the newest
 * snapshot, made at least that long ago, writes its index's image as `jobs-<sequence>`, the
 * jobs bucket's last sequence its watch had shown, with the delete markers retention has still
 * to remove; the one before stays (a start may be reading it), older ones go. A dispatcher
 * starts from the newest (`restore`): the settled jobs' entries from it, then the records written
 * after it and the unsettled jobs' records, instead of every record in the bucket.
 *
 * A start from a snapshot sees a job deleted after it only by that deletion's delete marker, so
 * retention removes a jobs bucket's marker only once a snapshot covers it (`coveredSeq`): one this
 * dispatcher has known for `coverGraceMs`, and not past the snapshot any dispatcher is starting
 * from. A starting dispatcher says which in a lease (`lease-<uuid>`, its sequence and how long it
 * holds) written before it reads the snapshot and removed once it has caught up; the grace is
 * for a lease being written as a newer snapshot is first seen.
 *
 * A snapshot belongs to one jobs stream: one cut from another (a bucket made again, a restore)
 * is never read, and the next write removes it.
 */
export class IndexSnapshots {
  private readonly sweeps: Sweep<boolean>;
  /** Snapshots this dispatcher has seen, by sequence, with when it first saw each. */
  private readonly seen = new Map<number, number>();
  /** This dispatcher's lease while it starts from a snapshot. */
  private lease: string | undefined;

  constructor(
    private readonly topology: Topology,
    private readonly index: JobIndex,
    /** The jobs bucket's last sequence the index reflects; undefined until the watch has caught up. */
    private readonly position: () => number | undefined,
    /** The jobs bucket's delete markers retention has still to remove. */
    private readonly markers: () => [string, number][],
    private readonly log: Logger,
    private readonly intervalMs: number,
    private readonly coverGraceMs: number,
  ) {
    this.sweeps = new Sweep({
      pass: () => this.write(),
      intervalMs,
      onError: (err) => log.warn({ err }, "could not write a snapshot of the job index; trying again later"),
    });
  }

  start(): void {
    this.sweeps.start();
  }

  async stop(): Promise<void> {
    await this.sweeps.stop();
    await this.release();
  }

  /**
   * Gives the index the newest snapshot's settled jobs, holding a lease on it until `release`;
   * resolves with where the watch goes on from, or undefined when there is none to use (none yet,
   * one of another stream, or one that cannot be read: logged), and then the index is as it was.
   */
  async restore(): Promise<StartingPoint | undefined> {
    let cut: Cut | undefined;
    try {
      // Read again once if removed as it was read: newer ones were written meanwhile.
      for (let attempt = 0; attempt < 2; attempt++) {
        const { store, stream, cuts } = await this.listing();
        cut = cuts.at(-1);
        if (!cut) return undefined;
        if (cut.seq > stream.lastSeq) throw new Error(`it is at sequence ${cut.seq}, past the bucket's last, ${stream.lastSeq}`);
        await this.hold(store, cut.seq);
        const began = performance.now();
        const bytes = await readWithin(store, cut.name, READ_PATIENCE_MS);
        if (!bytes) continue;
        const readMs = Math.round(performance.now() - began);
        const { meta, image } = decodeImage(bytes);
        const markers = checkMeta(meta, cut);
        if (image.unsettled.length * GET_COST > image.ids.length) {
          // A job's record read alone costs a few of a replay's: with so many to read, reading them all is as quick.
          const why = `${image.unsettled.length} of its ${image.unsettled.length + image.ids.length} jobs are not settled`;
          this.log.info({ snapshot: cut.name }, `the job index starts by reading every job record: ${why}`);
          await this.release();
          return undefined;
        }
        this.index.restore(image);
        const restoreMs = Math.round(performance.now() - began - readMs);
        return { seq: cut.seq, unsettled: image.unsettled, markers, settled: image.ids.length, bytes: bytes.length, readMs, restoreMs };
      }
      throw new Error("it was removed as it was read, twice");
    } catch (err) {
      this.log.warn({ err, snapshot: cut?.name }, "could not start from the job index's snapshot; reading every job record instead");
      await this.release();
      return undefined;
    }
  }

  /** Lets retention remove the markers past the snapshot this dispatcher started from: it has read them. */
  async release(): Promise<void> {
    const lease = this.lease;
    this.lease = undefined;
    if (lease) await (await this.topology.jobIndex()).delete(lease).catch(() => {});
  }

  /** Writes a snapshot now if the watch has moved past the newest one, made at least `intervalMs` ago; resolves with whether it did. */
  async write(): Promise<boolean> {
    const seq = this.position();
    if (seq === undefined) return false;
    const { store, stream, cuts, leases, names } = await this.listing();
    const newest = cuts.at(-1);
    if (newest && (newest.seq >= seq || Date.now() - newest.writtenAt < this.intervalMs)) return false;
    // Cut at once: the index is as the watch left it at `seq` until the next entry it shows.
    const began = performance.now();
    const at = this.position() ?? seq;
    const meta: Meta = { name: `jobs-${String(at).padStart(16, "0")}`, seq: at, created: stream.created, markers: this.markers() };
    const bytes = encodeImage(this.index.image(), meta);
    const cutMs = Math.round(performance.now() - began);
    await store.putBlob({ name: meta.name, metadata: { seq: String(meta.seq), created: meta.created } }, bytes);
    const writeMs = Math.round(performance.now() - began);
    this.log.info({ seq: meta.seq, bytes: bytes.length, cutMs, writeMs }, "wrote a snapshot of the job index");
    // The one before stays, for a start reading it; older ones, any of another stream and leases run out go.
    const now = Date.now();
    const kept = new Set([meta.name, newest?.name, ...leases.filter((l) => l.until >= now).map((l) => l.name)]);
    for (const name of names) if (!kept.has(name)) await store.delete(name).catch(() => {});
    return true;
  }

  /**
   * The jobs bucket's sequence up to which delete markers may be removed: the newest snapshot's
   * that this dispatcher has known for `coverGraceMs`, and no further than any lease (0 while
   * there is none).
   */
  async coveredSeq(): Promise<number> {
    const { cuts, leases } = await this.listing();
    const now = Date.now();
    for (const { seq } of cuts) if (!this.seen.has(seq)) this.seen.set(seq, now);
    let covered = 0;
    for (const [seq, since] of this.seen) {
      if (!cuts.some((c) => c.seq === seq)) this.seen.delete(seq);
      else if (now - since >= this.coverGraceMs) covered = Math.max(covered, seq);
    }
    for (const lease of leases) if (lease.until >= now) covered = Math.min(covered, lease.seq);
    return covered;
  }

  /** Holds the markers past `seq` until `release`. */
  private async hold(store: ObjectStore, seq: number): Promise<void> {
    await this.release();
    const name = `lease-${randomUUID()}`;
    const until = String(Date.now() + LEASE_MS);
    await store.putBlob({ name, metadata: { seq: String(seq), until } }, new Uint8Array(0));
    this.lease = name;
  }

  private async listing(): Promise<Listing> {
    const store = await this.topology.jobIndex();
    const { created, state } = await this.topology.jsm.streams.info(`KV_${this.topology.names.buckets.jobs}`);
    const infos = await store.list();
    const cuts = infos
      .flatMap((info) => {
        const seq = Number(info.metadata?.seq);
        const ok = info.name.startsWith("jobs-") && info.metadata?.created === created && Number.isSafeInteger(seq) && seq > 0;
        return ok ? [{ name: info.name, seq, created, writtenAt: Date.parse(info.mtime) }] : [];
      })
      .sort((a, b) => a.seq - b.seq);
    const leases = infos
      .filter((info) => info.name.startsWith("lease-"))
      .map((info) => ({ name: info.name, seq: Number(info.metadata?.seq) || 0, until: Number(info.metadata?.until) || 0 }));
    return { store, stream: { created, lastSeq: state.last_seq }, cuts, leases, names: infos.map((i) => i.name) };
  }
}

/**
 * How many records a replay shows in the time one record is read alone: 40 000 reads a second,
 * 256 at once, against a replay's 170 000 (a throwaway script on this machine, 2026-11-29).
 */
const GET_COST = 4;
/** How long a start holds its lease at most (a dispatcher that dies starting leaves it). */
const LEASE_MS = 15 * 60_000;
/**
 * How long a snapshot's read may take before the start reads every record instead: a read
 * whose object is removed meanwhile never ends. A million jobs' snapshot reads in about 1 s.
 */
const READ_PATIENCE_MS = 60_000;

/** `name`'s bytes, or undefined if it is gone or not read within `ms`. */
async function readWithin(store: ObjectStore, name: string, ms: number): Promise<Uint8Array | undefined> {
  const giveUp = new AbortController();
  const late = sleep(ms, undefined, { signal: giveUp.signal }).then(
    () => {
      throw new Error(`it was not read in ${ms / 1000} s`);
    },
    () => undefined,
  );
  try {
    return (await Promise.race([store.getBlob(name), late])) ?? undefined;
  } finally {
    giveUp.abort();
  }
}

/** The markers `meta` carries, once it is checked to name `cut`. */
function checkMeta(meta: unknown, cut: Cut): [string, number][] {
  const m = meta as Partial<Meta> | null;
  if (m?.seq !== cut.seq || m.created !== cut.created) throw new Error("its header names another cut than its name");
  const markers = m.markers ?? [];
  if (!Array.isArray(markers) || !markers.every((x) => Array.isArray(x) && typeof x[0] === "string" && Number.isSafeInteger(x[1])))
    throw new Error("its delete markers are not keys and sequences");
  return markers;
}
