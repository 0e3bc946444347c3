import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";

/** How a reader of a history follows it: on past its end as new entries come (`follow`), until `signal` aborts. */
export interface FollowOptions {
  follow?: boolean;
  signal?: AbortSignal;
}

/**
 * How a client follows what is stored: it reads pages of history through the dispatchers' API
 * and, while following, asks for the next page when a message arrives on the live subjects it
 * watches (core NATS subscriptions, which need no JetStream access). The history is the record;
 * a live message only says there may be more of it.
 */

/** How often a follow reads again although nothing came: a live message can be missed, the history cannot. */
export const RECHECK_MS = 5_000;
/** How soon a follow reads again when a live message came before the stream had stored it. */
const RETRY_MS = 100;
const RETRIES = 3;

/** Rings when a message that `matters` arrives on any of `subjects`. */
export class Wake implements Disposable {
  private pending = false;
  private ring?: () => void;

  private constructor(private readonly subs: Subscription[]) {}

  /** Subscribes (and waits until the server has the subscriptions, so nothing published after is missed). */
  static async open(nc: NatsConnection, subjects: readonly string[], matters: (msg: Msg) => boolean = () => true): Promise<Wake> {
    const wake: Wake = new Wake([]);
    for (const subject of subjects) {
      wake.subs.push(
        nc.subscribe(subject, {
          callback: (err, msg) => {
            if (err || !matters(msg)) return;
            wake.pending = true;
            wake.ring?.();
          },
        }),
      );
    }
    await nc.flush();
    return wake;
  }

  /** Resolves when a message came (at once if one came since the last wait: true), after `ms` or on abort (false). */
  async wait(ms: number, signal?: AbortSignal): Promise<boolean> {
    if (!this.pending && !signal?.aborted) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, ms);
        const self = this;
        function done() {
          clearTimeout(timer);
          self.ring = undefined;
          signal?.removeEventListener("abort", done);
          resolve();
        }
        this.ring = done;
        signal?.addEventListener("abort", done, { once: true });
      });
    }
    const rang = this.pending;
    this.pending = false;
    return rang;
  }

  [Symbol.dispose](): void {
    for (const sub of this.subs) sub.unsubscribe();
  }
}

/** One page of history: its items, the sequence it ends at, and whether more was stored. */
export interface HistoryPage<T> {
  items: T[];
  last: number;
  more: boolean;
}

export interface FollowPagesOptions<T> {
  /** Keep reading as more is stored, until `done` or `signal`. */
  follow?: boolean;
  signal?: AbortSignal;
  /** Where new history is announced (only subscribed to with `follow`). */
  live: readonly string[];
  /** Only these live messages announce history (default all). */
  matters?: (msg: Msg) => boolean;
  /** Ends the follow after this item. */
  done?: (item: T) => boolean;
  /** Ends the follow once the history read so far is all there is: asked when a read finds nothing new. */
  finished?: () => boolean | Promise<boolean>;
}

/** Every item of a history, oldest first; with `follow`, also what is stored later. */
export async function* followPages<T>(
  nc: NatsConnection,
  read: (after: number) => Promise<HistoryPage<T>>,
  opts: FollowPagesOptions<T>,
): AsyncGenerator<T> {
  using wake = opts.follow ? await Wake.open(nc, opts.live, opts.matters) : undefined;
  let quick = 0; // reads left at the short interval
  for (let after = 0; ; ) {
    const page = await read(after);
    after = page.last;
    for (const item of page.items) {
      yield item;
      if (opts.done?.(item)) return;
    }
    if (page.more) continue;
    if (!wake || opts.signal?.aborted || (await opts.finished?.())) return;
    if (page.items.length > 0) quick = 0;
    const ms = quick > 0 ? RETRY_MS : RECHECK_MS;
    quick = Math.max(0, quick - 1);
    // A live message can arrive before the stream has stored it: then read again soon, a few times.
    if (await wake.wait(ms, opts.signal)) quick = RETRIES;
    if (opts.signal?.aborted) return;
  }
}
