import { createHash } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { isRevisionConflict, isStorageFull } from "@boxcar/fabric/internal";
import { BoxcarError, ErrorCode, type JobSpec } from "@boxcar/protocol";
import type { KV } from "@nats-io/kv";

/** How long a change keeps trying when other dispatchers change the same entry first. */
const CHANGE_WITHIN_MS = 5_000;

/** What a limit's key is read from: the job's owner, input and labels. */
export interface KeyedJob {
  spec: Pick<JobSpec, "input" | "labels">;
  owner: string;
}

/**
 * Which value of a limit's key (`owner`, `input.<field>...` or `label.<name>`) a job has, as a
 * digest fit for a KV key or a subject token: one limit per value, and one for all the jobs
 * that have none. Undefined for a limit with no key.
 */
export function valueDigest(key: string | undefined, job: KeyedJob): string | undefined {
  if (key === undefined) return undefined;
  return createHash("sha256")
    .update(valueAt(job, key) ?? "\0none")
    .digest("hex")
    .slice(0, 32);
}

/**
 * A job's value of a limit's key, as text: its owner, a field of its input, or one of its
 * labels. Only a string or a number is a value (`1` and `"1"` are one); anything else is none.
 */
function valueAt({ spec, owner }: KeyedJob, key: string): string | undefined {
  const [where, ...path] = key.split(".");
  let value: unknown;
  if (where === "owner") value = owner;
  else if (where === "label") value = ownField(spec.labels, path.join("."));
  else {
    value = spec.input;
    for (const field of path) value = ownField(value, field);
  }
  return typeof value === "string" || (typeof value === "number" && Number.isFinite(value)) ? String(value) : undefined;
}

/** A plain object's own field (never one it inherits, such as `constructor`). */
function ownField(value: unknown, field: string): unknown {
  return value !== null && typeof value === "object" && !Array.isArray(value) && Object.hasOwn(value, field)
    ? (value as Record<string, unknown>)[field]
    : undefined;
}

/** What one look at a limit's entry decides: what it holds next (nothing to write: leave it), and what the change returns. */
export interface Step<R> {
  write?: string;
  result: R;
}

interface Edit {
  what: string;
  step: (held: string | undefined) => Step<unknown>;
  resolve(result: unknown): void;
  reject(err: unknown): void;
}

/** A limit's entry could not be changed for now (too busy, or the bucket full): `unavailable`, worth trying again. */
export class LimitBusy extends BoxcarError {
  constructor(message: string) {
    super(ErrorCode.unavailable, message);
  }
}

/** How many entries' last known revisions a dispatcher remembers. */
const REMEMBERED = 10_000;

/**
 * The limits bucket's entries as one dispatcher changes them: by compare-and-swap, with no lock.
 * The edits of one entry this dispatcher asks for while one is being written wait, then are
 * applied in order and written together (one write for many jobs), and the entry's revision
 * this dispatcher last wrote or read is remembered, so that while no other dispatcher changes
 * the entry an edit costs one round trip (the write), not two. When another dispatcher changed it
 * first, it is read again after a moment's jittered pause (so that many do not collide again) and
 * the edits are applied afresh, for up to 5 s; then, or when the bucket is full, `unavailable`.
 * An edit that writes nothing (or refuses) on what was remembered is tried again on a fresh read:
 * only a write confirms that what it was shown was current.
 */
export class LimitEntries {
  private readonly known = new Map<string, { revision: number; held: string | undefined }>();
  private readonly waiting = new Map<string, Edit[]>();

  constructor(private readonly bucket: () => Promise<KV>) {}

  /**
   * Changes `key`'s entry: `step` is shown what it holds (undefined: nothing, or what the edits
   * before it in its batch left) and says what it should hold. A step that throws rejects its own
   * change alone. `what` names the limit in an `unavailable` error.
   */
  change<R>(key: string, what: string, step: (held: string | undefined) => Step<R>): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      const edit: Edit = { what, step, resolve: resolve as (result: unknown) => void, reject };
      const queue = this.waiting.get(key);
      if (queue) {
        queue.push(edit);
        return;
      }
      this.waiting.set(key, [edit]);
      void this.drain(key);
    });
  }

  /** What `key`'s entry holds now (a fresh read, remembered for the next change). */
  async read(key: string): Promise<string | undefined> {
    const entry = await (await this.bucket()).get(key);
    const held = entry?.operation === "PUT" ? entry.string() : undefined;
    this.remember(key, { revision: entry?.revision ?? 0, held });
    return held;
  }

  private async drain(key: string): Promise<void> {
    for (;;) {
      const batch = this.waiting.get(key)?.splice(0) ?? [];
      if (batch.length === 0) {
        this.waiting.delete(key);
        return;
      }
      await this.write(key, batch).catch((err: unknown) => {
        for (const edit of batch) edit.reject(err);
      });
    }
  }

  /** Applies a batch of edits to the entry and writes the outcome, reading the entry again while another dispatcher's write gets in first. */
  private async write(key: string, batch: Edit[]): Promise<void> {
    const bucket = await this.bucket();
    const giveUpAt = Date.now() + CHANGE_WITHIN_MS;
    for (let tries = 1; ; tries++) {
      let known = this.known.get(key);
      const remembered = known !== undefined;
      if (!known) {
        const entry = await bucket.get(key);
        known = { revision: entry?.revision ?? 0, held: entry?.operation === "PUT" ? entry.string() : undefined };
      }
      let held = known.held;
      const outcomes = batch.map((edit) => {
        try {
          const { write, result } = edit.step(held);
          if (write !== undefined) held = write;
          return { result };
        } catch (err) {
          return { err };
        }
      });
      const settle = () => {
        for (const [i, outcome] of outcomes.entries()) {
          const edit = batch[i] as Edit;
          if ("err" in outcome) edit.reject(outcome.err);
          else edit.resolve(outcome.result);
        }
      };
      if (held === known.held) {
        // Nothing to write: a decision taken on what it read just now stands; one taken on what
        // it remembered (another dispatcher may have changed the entry since) is taken again on
        // a fresh read (a write would have been refused instead).
        if (remembered) {
          this.known.delete(key);
          continue;
        }
        this.remember(key, known);
        settle();
        return;
      }
      try {
        const next = held as string;
        const revision = known.held === undefined ? await bucket.create(key, next) : await bucket.update(key, next, known.revision);
        this.remember(key, { revision, held: next });
        settle();
        return;
      } catch (err) {
        this.known.delete(key);
        if (isStorageFull(err)) {
          throw new LimitBusy("the limits bucket is full (256 MiB of limits' states): submit again later");
        }
        if (!isRevisionConflict(err)) throw err;
      }
      if (Date.now() > giveUpAt) {
        throw new LimitBusy(`too many jobs of ${batch[0]?.what} changed its limit at once: submit again`);
      }
      await sleep(Math.random() * Math.min(50, 2 * tries));
    }
  }

  private remember(key: string, known: { revision: number; held: string | undefined }): void {
    this.known.delete(key);
    this.known.set(key, known);
    if (this.known.size > REMEMBERED) this.known.delete(this.known.keys().next().value as string);
  }
}
