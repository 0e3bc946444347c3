import { type Logger, newInbox, type Topology } from "@boxcar/client";
import { PRIORITIES, type Priority } from "@boxcar/protocol";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { WorkDelivery } from "./work-delivery.js";

/**
 * How long a pull for work a bell announced waits for it: the bell (a plain copy of the publish)
 * can arrive before the stream has stored the item, and a pull that did not wait would find
 * nothing. Another worker may also take the item first; then the pull ends empty after this.
 */
const ANNOUNCED_WAIT_MS = 200;
/** How long a pull may go unanswered before it counts as failed (the server is gone, say). */
const PULL_TIMEOUT_MS = 5_000;

/** One priority of a pool: its work subject, bell and consumer, and what this puller knows of it. */
interface Level {
  readonly priority: Priority;
  readonly subject: string;
  readonly bell: string;
  /** The consumer's pull endpoint: `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`. */
  readonly next: string;
  /** Bells heard since this level was last pulled, and when the last one rang. */
  rung: number;
  rungAt: number;
  /** Pulled dry while the bells were on and no bell since: skipped until one rings or a full sweep is due. */
  empty: boolean;
  /** The last pull of this level failed: said once, not on every sweep. */
  failing: boolean;
}

type TakeWork = (delivery: WorkDelivery, priority: Priority) => void;

/**
 * Takes a pool's work for one worker, higher priorities first. Each priority has its own
 * consumer; a sweep asks them in order without waiting (`no_wait` pulls), so a waiting `high`
 * item is always taken before a `normal` one, whatever the order they were queued in.
 *
 * An idle worker cannot keep a waiting pull open on every consumer: each would hold a slot it
 * may not have, and a pull cannot be withdrawn. Instead, once a sweep finds nothing, the puller
 * listens on the pool's work subjects ("bells": JetStream publishes reach plain subscribers
 * too) and sweeps again when one rings, skipping the priorities it found empty since. When a
 * sweep fills every slot offered the pool is busy, and the bells are dropped, so busy workers
 * do not receive a copy of every item.
 *
 * An item that comes back without a publish makes no copy to hear: one handed back (a drain, or
 * a retry's backoff), or one whose lease ran out. When an item this worker handed back comes
 * due, the puller rings the pool's bell on `ctl.bell.<pool>.<priority>`, which idle workers of
 * the pool (this one included) listen on too. For the rest, a sweep asks every consumer, empty
 * or not, at least every `recheckMs`, and an idle wait that hears no bell ends after that long;
 * that also bounds what a lost bell costs (say, one published through a cluster route that had
 * not yet learnt of the subscription, or by a worker that died before the item came due).
 */
export class PoolPuller {
  private readonly nc: NatsConnection;
  private readonly levels: Level[];
  private readonly bellsSubject: string;
  private bells: Subscription[] | undefined;
  private wake: (() => void) | undefined;
  /** Bells to ring when items this worker handed back come due. */
  private readonly dueTimers = new Set<NodeJS.Timeout>();
  /** When a sweep last asked every consumer, skipping none it thought empty. */
  private sweptAllAt = 0;
  private closed = false;

  constructor(
    topology: Topology,
    pool: string,
    private readonly opts: { recheckMs: number; log: Logger },
  ) {
    const { names } = topology;
    this.nc = topology.nc;
    this.bellsSubject = names.subjects.bells(pool);
    this.levels = PRIORITIES.map((priority) => ({
      priority,
      subject: names.subjects.work(pool, priority),
      bell: names.subjects.bell(pool, priority),
      next: `$JS.API.CONSUMER.MSG.NEXT.${names.streams.work}.${names.poolConsumer(pool, priority)}`,
      rung: 0,
      rungAt: 0,
      empty: false,
      failing: false,
    }));
  }

  /**
   * Takes up to `max` waiting work items, highest priority first, handing each to `take` as it
   * arrives. Resolves with how many came. A consumer that cannot be pulled is logged and passed
   * over, so the others are still served; the sweep fails only when every consumer it asked did.
   */
  async take(max: number, take: TakeWork): Promise<number> {
    const askAll = Date.now() - this.sweptAllAt >= this.opts.recheckMs;
    let taken = 0;
    let skipped = 0;
    const failures: unknown[] = [];
    for (const level of this.levels) {
      const want = max - taken;
      if (want === 0) break;
      if (level.empty && level.rung === 0 && !askAll) {
        skipped += 1;
        continue;
      }
      try {
        taken += await this.takeFrom(level, want, take);
        if (level.failing) this.opts.log.info({ priority: level.priority }, "pulling work works again");
        level.failing = false;
      } catch (err) {
        failures.push(err);
        if (!level.failing) this.opts.log.warn({ err, priority: level.priority }, "pulling work failed; asking the other priorities");
        level.failing = true;
      }
    }
    if (skipped === 0 && taken < max) this.sweptAllAt = Date.now();
    if (failures.length > 0 && failures.length + skipped === this.levels.length && taken === 0) throw failures[0];
    if (taken === max) this.quiet();
    return taken;
  }

  /**
   * Waits until work may have come: a bell rang, `recheckMs` passed, or `signal` aborted. The
   * first call after a busy spell only turns the bells on and returns, so the caller's next
   * sweep cannot miss an item published before they were on.
   */
  async waitForWork(signal: AbortSignal): Promise<void> {
    if (!this.bells) {
      this.listen();
      await this.nc.flush();
      return;
    }
    if (signal.aborted || this.levels.some((l) => l.rung > 0)) return;
    await new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        this.wake = undefined;
        resolve();
      };
      const timer = setTimeout(done, this.opts.recheckMs);
      signal.addEventListener("abort", done, { once: true });
      this.wake = done;
    });
  }

  /** Drops the bells, and the bells still to ring: from now on a hand-back rings only when due at once. */
  close(): void {
    this.closed = true;
    this.quiet();
    for (const timer of this.dueTimers) clearTimeout(timer);
    this.dueTimers.clear();
  }

  /**
   * One level's share of a sweep: what is waiting, at once; then, if bells announced more than
   * came, a wait for the rest until 200 ms after the last bell (a bell can arrive before the
   * stream has stored its item).
   */
  private async takeFrom(level: Level, want: number, take: TakeWork): Promise<number> {
    const announced = Math.min(level.rung, want);
    const waitMs = ANNOUNCED_WAIT_MS - (Date.now() - level.rungAt);
    level.rung = 0;
    const handOver = (msg: Msg) =>
      take(
        WorkDelivery.from(this.nc, msg, (delayMs) => this.ringWhenDue(level, delayMs)),
        level.priority,
      );
    let got = await this.pull(level, { batch: want }, handOver);
    if (got < announced && waitMs > 0) got += await this.pull(level, { batch: announced - got, waitMs }, handOver);
    // Dry only if no bell rang meanwhile: a bell during the pull may be for an item it missed.
    level.empty = this.bells !== undefined && got < want && level.rung === 0;
    return got;
  }

  private listen(): void {
    this.bells = [
      ...this.levels.map((level) => this.nc.subscribe(level.subject, { callback: () => this.ring(level) })),
      this.nc.subscribe(this.bellsSubject, {
        callback: (_err, msg) => {
          const level = this.levels.find((l) => l.bell === msg.subject);
          if (level) this.ring(level);
        },
      }),
    ];
    for (const level of this.levels) level.empty = false;
  }

  private ring(level: Level): void {
    level.rung += 1;
    level.rungAt = Date.now();
    level.empty = false;
    this.wake?.();
  }

  private ringWhenDue(level: Level, delayMs: number): void {
    if (delayMs <= 0) {
      this.ringPool(level);
      return;
    }
    if (this.closed) return;
    const timer = setTimeout(() => {
      this.dueTimers.delete(timer);
      this.ringPool(level);
    }, delayMs);
    timer.unref();
    this.dueTimers.add(timer);
  }

  /** A courtesy to idle workers: when it cannot be sent, their sweeps find the item anyway. */
  private ringPool(level: Level): void {
    if (this.nc.isClosed() || this.nc.isDraining()) return;
    try {
      this.nc.publish(level.bell);
    } catch {
      // the connection closed meanwhile
    }
  }

  private quiet(): void {
    for (const bell of this.bells ?? []) bell.unsubscribe();
    this.bells = undefined;
    for (const level of this.levels) {
      level.rung = 0;
      level.empty = false;
    }
  }

  /**
   * One pull request: up to `batch` items, at once (`no_wait`) or waiting up to `waitMs` for
   * them. JetStream ends it with a status (404 none waiting, 408 fewer than asked by the time it
   * expired) unless it sent the whole batch.
   */
  private pull(level: Level, req: { batch: number; waitMs?: number }, take: (msg: Msg) => void): Promise<number> {
    const { nc } = this;
    return new Promise<number>((resolve, reject) => {
      let got = 0;
      const inbox = newInbox(nc);
      const end = (err?: Error) => {
        clearTimeout(timer);
        sub.unsubscribe();
        if (err) reject(err);
        else resolve(got);
      };
      const sub = nc.subscribe(inbox, {
        callback: (err, msg) => {
          if (err) return end(err);
          if (!msg.reply) return end(pullStatusError(level, msg));
          got += 1;
          try {
            take(msg);
          } catch (cause) {
            return end(cause as Error);
          }
          if (got === req.batch) end();
        },
      });
      const timer = setTimeout(
        () => end(new Error(`no answer from the ${level.priority} work consumer (${level.next}) in ${PULL_TIMEOUT_MS} ms`)),
        (req.waitMs ?? 0) + PULL_TIMEOUT_MS,
      );
      const body = req.waitMs === undefined ? { batch: req.batch, no_wait: true } : { batch: req.batch, expires: req.waitMs * 1_000_000 };
      nc.publish(level.next, JSON.stringify(body), { reply: inbox });
    });
  }
}

/** A status that ends a pull: undefined for the ordinary ends (404, 408), else what went wrong. */
function pullStatusError(level: Level, msg: Msg): Error | undefined {
  const code = msg.headers?.code ?? 0;
  if (code === 404 || code === 408) return undefined;
  const why = code === 503 ? "no such consumer (no responders)" : `${code} ${msg.headers?.description ?? ""}`.trim();
  return new Error(`pulling ${level.priority} work from ${level.next} failed: ${why}`);
}
