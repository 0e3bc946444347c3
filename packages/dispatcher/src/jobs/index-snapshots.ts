import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import type { ObjectInfo, ObjectStore } from "@nats-io/obj";
import { Sweep } from "../loops/sweep.js";
import { decodeImage, encodeImage } from "./index-image.js";
import type { JobIndex } from "./job-index.js";

/** Where a start from a snapshot goes on from: the records after `seq`, and the unsettled jobs' records. */
export interface StartingPoint {
  /** The jobs bucket's last sequence the snapshot reflects. */
  seq: number;
  /** The jobs it holds no entry of (not ended, or with something left to do): their records are read again. */
  unsettled: string[];
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

/**
 * The job index's snapshots, in the dispatchers' own Object Store (docs/operations.md, "Start-up
 * at a million jobs"): every `intervalMs`, a dispatcher whose watch has moved past the newest
 * snapshot, made at least that long ago, writes its index's image as `jobs-<sequence>`, the
 * jobs bucket's last sequence its watch had shown, and removes the older ones. A dispatcher
 * starts from the newest (`restore`): the settled jobs' entries from it, then the records written
 * after it and the unsettled jobs' records, instead of every record in the bucket.
 *
 * A start from a snapshot sees a job deleted after it only by that deletion's delete marker, so
 * retention removes a jobs bucket's marker only once a snapshot covers it (`coveredSeq`). A
 * snapshot counts as covering once this dispatcher has known it for `coverGraceMs`: time for a
 * dispatcher that started from the one before to have read the markers after it.
 *
 * A snapshot belongs to one jobs stream: one cut from another (a bucket made again, a restore)
 * is never read, and the next write removes it.
 */
export class IndexSnapshots {
  private readonly sweeps: Sweep<boolean>;
  /** Snapshots this dispatcher has seen, by sequence, with when it first saw each. */
  private readonly seen = new Map<number, number>();

  constructor(
    private readonly topology: Topology,
    private readonly index: JobIndex,
    /** The jobs bucket's last sequence the index reflects; undefined until the watch has caught up. */
    private readonly position: () => number | undefined,
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

  stop(): Promise<void> {
    return this.sweeps.stop();
  }

  /**
   * Gives the index the newest snapshot's settled jobs; resolves with where the watch goes on
   * from, or undefined when there is none to use (none yet, one of another stream, or one that
   * cannot be read: logged), and then the index is as it was.
   */
  async restore(): Promise<StartingPoint | undefined> {
    let cut: Cut | undefined;
    try {
      const store = await this.topology.jobIndex();
      const stream = await this.jobsStream();
      // Read again once if removed as it was read: a newer one was written meanwhile.
      for (let attempt = 0; attempt < 2; attempt++) {
        cut = (await this.cuts(store, stream.created)).at(-1);
        if (!cut) return undefined;
        if (cut.seq > stream.lastSeq) throw new Error(`it is at sequence ${cut.seq}, past the bucket's last, ${stream.lastSeq}`);
        const began = performance.now();
        const bytes = await store.getBlob(cut.name);
        if (!bytes) continue;
        const readMs = Math.round(performance.now() - began);
        const { meta, image } = decodeImage(bytes);
        const written = meta as Partial<Cut> | null;
        if (written?.seq !== cut.seq || written.created !== cut.created) throw new Error("its header names another cut than its name");
        if (image.unsettled.length * GET_COST > image.ids.length) {
          // A job's record read alone costs a few of a replay's: with so many to read, reading them all is as quick.
          const why = `${image.unsettled.length} of its ${image.unsettled.length + image.ids.length} jobs are not settled`;
          this.log.info({ snapshot: cut.name }, `the job index starts by reading every job record: ${why}`);
          return undefined;
        }
        this.index.restore(image);
        const restoreMs = Math.round(performance.now() - began - readMs);
        return { seq: cut.seq, unsettled: image.unsettled, settled: image.ids.length, bytes: bytes.length, readMs, restoreMs };
      }
      throw new Error("it was removed as it was read, twice");
    } catch (err) {
      this.log.warn({ err, snapshot: cut?.name }, "could not start from the job index's snapshot; reading every job record instead");
      return undefined;
    }
  }

  /** Writes a snapshot now if the watch has moved past the newest one, made at least `intervalMs` ago; resolves with whether it did. */
  async write(): Promise<boolean> {
    const seq = this.position();
    if (seq === undefined) return false;
    const store = await this.topology.jobIndex();
    const stream = await this.jobsStream();
    const infos = await store.list();
    const cuts = parse(infos, stream.created);
    const newest = cuts.at(-1);
    const newestInfo = infos.find((i) => i.name === newest?.name);
    if (newest && (newest.seq >= seq || Date.now() - Date.parse(newestInfo?.mtime ?? "") < this.intervalMs)) return false;
    // Cut at once: the index is as the watch left it at `seq` until the next entry it shows.
    const began = performance.now();
    const at = this.position() ?? seq;
    const cut: Cut = { name: `jobs-${String(at).padStart(16, "0")}`, seq: at, created: stream.created };
    const bytes = encodeImage(this.index.image(), cut);
    const cutMs = Math.round(performance.now() - began);
    await store.putBlob({ name: cut.name, metadata: { seq: String(cut.seq), created: cut.created } }, bytes);
    const writeMs = Math.round(performance.now() - began);
    this.log.info({ seq: cut.seq, bytes: bytes.length, cutMs, writeMs }, "wrote a snapshot of the job index");
    // The older ones, and any of another stream, go.
    for (const info of infos) if (info.name !== cut.name) await store.delete(info.name).catch(() => {});
    return true;
  }

  /**
   * The jobs bucket's sequence up to which delete markers may be removed: the newest snapshot's,
   * once this dispatcher has known it for `coverGraceMs` (0 while there is none).
   */
  async coveredSeq(): Promise<number> {
    const stream = await this.jobsStream();
    const cuts = await this.cuts(await this.topology.jobIndex(), stream.created);
    const now = Date.now();
    for (const { seq } of cuts) if (!this.seen.has(seq)) this.seen.set(seq, now);
    let covered = 0;
    for (const [seq, since] of this.seen) {
      if (!cuts.some((c) => c.seq === seq)) this.seen.delete(seq);
      else if (now - since >= this.coverGraceMs) covered = Math.max(covered, seq);
    }
    return covered;
  }

  private async cuts(store: ObjectStore, created: string): Promise<Cut[]> {
    return parse(await store.list(), created);
  }

  private async jobsStream(): Promise<{ created: string; lastSeq: number }> {
    const info = await this.topology.jsm.streams.info(`KV_${this.topology.names.buckets.jobs}`);
    return { created: info.created, lastSeq: info.state.last_seq };
  }
}

/**
 * How many records a replay shows in the time one record is read alone: 40 000 reads a second,
 * 256 at once, against a replay's 170 000 (a throwaway script on this machine, 2026-11-29).
 */
const GET_COST = 4;

/** The snapshots among `infos` cut from the stream created at `created`, oldest first. */
function parse(infos: ObjectInfo[], created: string): Cut[] {
  return infos
    .flatMap((info) => {
      const seq = Number(info.metadata?.seq);
      return info.metadata?.created === created && Number.isSafeInteger(seq) && seq > 0 ? [{ name: info.name, seq, created }] : [];
    })
    .sort((a, b) => a.seq - b.seq);
}
