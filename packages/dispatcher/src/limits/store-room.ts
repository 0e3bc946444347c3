import type { Topology } from "@boxcar/fabric";
import { BoxcarError, ErrorCode, type SystemPolicy } from "@boxcar/protocol";

const MiB = 1024 ** 2;
/** How old the store's figures may be when a new job is admitted (where they leave less than the headroom, they are asked again: a store freed is seen at once). */
const FRESH_MS = 1_000;
/** How long a size learned from JetStream's refusal stands (a store given more since is learned again at its next refusal). */
const LEARNED_FOR_MS = 3_600_000;

/** The headroom a policy that sets none keeps: 5% of the store, at least 1 MiB and at most 1 GiB. */
export function defaultHeadroom(capacity: number): number {
  return Math.min(1024 * MiB, Math.max(MiB, Math.floor(capacity * 0.05)));
}

const mib = (n: number) => `${Math.round((n / MiB) * 10) / 10} MiB`;

/**
 * How much room JetStream's store has left, as one dispatcher knows it, so that new work is
 * refused while there is still room for the jobs already admitted to run and end, for deletions'
 * delete markers, and for the roles' own writes (the policy's `queue.headroom`). What the store
 * holds is the account's JetStream usage, asked at most once a second (plus what this dispatcher
 * wrote since); how big it is is the account's JetStream limit, or, where the account has none
 * (a server's `max_file_store` is not told to clients), what the store held when JetStream last
 * refused a write for want of room (an hour at most, or until clearly more is stored: a store
 * given more is learned again). Until the store's size is known, nothing is refused here.
 */
export class StoreRoom {
  private used = 0;
  private usedAt = Number.NEGATIVE_INFINITY;
  private limit: number | undefined;
  private learned: { bytes: number; at: number } | undefined;
  private refreshing: Promise<void> | undefined;

  constructor(private readonly topology: Topology) {}

  /** How big the store is, when known. */
  get capacity(): number | undefined {
    if (this.limit !== undefined) return this.limit;
    if (this.learned && Date.now() - this.learned.at <= LEARNED_FOR_MS) return this.learned.bytes;
    return undefined;
  }

  /** Asks JetStream what the account holds when the figures are older than a second (one request for any number of callers). */
  async refresh(maxAgeMs = FRESH_MS): Promise<void> {
    if (Date.now() - this.usedAt < maxAgeMs) return;
    this.refreshing ??= (async () => {
      try {
        const info = await this.topology.jsm.getAccountInfo();
        this.used = info.storage;
        this.usedAt = Date.now();
        this.limit = info.limits.max_storage > 0 ? info.limits.max_storage : undefined;
        // Clearly more stored than the size learned (not a marker's bytes squeezed in at the edge): the store was given more.
        if (this.learned && info.storage > this.learned.bytes * 1.01 + MiB) this.learned = undefined;
      } finally {
        this.refreshing = undefined;
      }
    })();
    await this.refreshing;
  }

  /** A write JetStream refused for want of room: the store holds all it can, which is its size. */
  async noteFull(): Promise<void> {
    this.usedAt = Number.NEGATIVE_INFINITY;
    await this.refresh().catch(() => {});
    if (Number.isFinite(this.usedAt)) this.learned = { bytes: this.used, at: Date.now() };
  }

  /**
   * Brings the figures up to date for `check`: at most a second old, and asked again (joining a
   * request under way) where they leave less than the headroom, so that room freed is seen at once.
   */
  async prepare(policy: SystemPolicy): Promise<void> {
    await this.refresh(this.short(policy) ? 0 : FRESH_MS);
  }

  /** Counts bytes this dispatcher has just stored (a job's record) until the next refresh says what the account holds. */
  wrote(bytes: number): void {
    this.used += bytes;
  }

  /**
   * Refuses new work, with `storage_full`, while less than the policy's headroom is free, as last
   * known (`prepare` first brings that up to date; where a caller did not, figures more than a
   * second old are asked again for the next caller).
   */
  check(policy: SystemPolicy): void {
    const capacity = this.capacity;
    if (capacity === undefined || !this.short(policy)) return;
    if (Date.now() - this.usedAt >= FRESH_MS) void this.refresh().catch(() => {});
    const headroom = policy.queue.headroom ?? defaultHeadroom(capacity);
    throw new BoxcarError(
      ErrorCode.storageFull,
      `no room for new work: JetStream's store holds ${mib(this.used)} of ${mib(capacity)}, and the last ${mib(headroom)} are kept for the jobs already admitted, deletions and the system's own writes; nothing was kept. ` +
        "Submit again once retention or boxcar clean has deleted ended jobs (an admin sets the headroom with the system policy's queue.headroom)",
    );
  }

  /** True when the figures, as last known, leave less than the headroom free. */
  private short(policy: SystemPolicy): boolean {
    const capacity = this.capacity;
    if (capacity === undefined) return false;
    const headroom = policy.queue.headroom ?? defaultHeadroom(capacity);
    return headroom > 0 && capacity - this.used < headroom;
  }
}
