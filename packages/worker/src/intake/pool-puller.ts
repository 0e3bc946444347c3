import { type Logger, newInbox } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { PRIORITIES, type Priority } from "@boxcar/protocol";
import type { Msg, NatsConnection, Status } from "@nats-io/transport-node";
import { WorkDelivery } from "./work-delivery.js";

/** How long a `no_wait` pull may go unanswered before it counts as lost (the server is gone, say). */
const PULL_TIMEOUT_MS = 5_000;
/**
 * How long an idle worker's waiting pull lasts at the server before it is renewed. Long: on a
 * cluster each waiting pull added or ended is a proposal replicated to the consumer's peers,
 * so renewals are what an idle fleet costs the servers (docs/benchmarks.md#idle-workers).
 */
const IDLE_PULL_MS = 300_000;
/**
 * How often the consumer's leader tells a waiting pull that it still holds it (a `100 Idle
 * Heartbeat` status). Each one costs the leader a walk of its waiting pulls, so an idle fleet
 * costs the servers in proportion (docs/benchmarks.md#idle-workers).
 */
const IDLE_HEARTBEAT_MS = 20_000;
/**
 * A waiting pull not heard from for this many heartbeats is taken for lost: a heartbeat and a
 * quarter, so a lost pull is found within 25 s, inside the 30 s a worker has to notice its
 * consumer's leader went away without a word.
 */
const SILENT_HEARTBEATS = 1.25;
/** Pause before a waiting pull that failed is asked again. */
const FAILED_PULL_PAUSE_MS = 1_000;

/** One priority of a pool: its consumer and what this puller knows of it. */
interface Level {
  readonly priority: Priority;
  /** Where its items are published: a delivery carries this subject. */
  readonly subject: string;
  /** The consumer's pull endpoint: `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`. */
  readonly next: string;
  /** The last pull of this level failed: said once, not on every sweep. */
  failing: boolean;
}

type TakeWork = (delivery: WorkDelivery, priority: Priority) => void;

/** How a puller logs, and (for tests) how long its idle waits last and beat. */
export interface PoolPullerOptions {
  log: Logger;
  /** How long a waiting pull lasts at the server (`IDLE_PULL_MS`). */
  idlePullMs?: number;
  /** How often its consumer's leader says it still holds a waiting pull (`IDLE_HEARTBEAT_MS`). */
  idleHeartbeatMs?: number;
}

/** What an idle wait needs from the worker. */
export interface IdleWait {
  signal: AbortSignal;
  /**
   * Offered each item that comes while the worker waits: true when it took the item (a slot was
   * free), false when it had no slot for it; the item then goes back to the queue at once.
   */
  offer(delivery: WorkDelivery, priority: Priority): boolean;
  /** Calls `full` when the worker has no free slot left; returns how to stop listening. */
  onFull(full: () => void): () => void;
  /** Told when a waiting pull fails (the wait goes on, asking again in a moment): its consumer may be gone. */
  onPullFailed?(err: Error): void;
}

/**
 * Takes a pool's work for one worker, higher priorities first. Each priority has its own
 * consumer.
 *
 * While the worker has free slots and work waits, it sweeps: it asks the consumers in order,
 * without waiting (`no_wait` pulls), for as many items as it has slots reserved, so a waiting
 * `high` item is always taken before a `normal` one, whatever the order they were queued in.
 *
 * Once a sweep finds every priority empty, the worker waits for work with one waiting pull per
 * priority, one item each (`waitForWork`). JetStream hands a new item, one handed back or one
 * whose lease ran out straight to a waiting pull, so nothing else is needed to hear of work. A
 * waiting pull lasts `IDLE_PULL_MS` and the consumer's leader sends it a heartbeat every
 * `IDLE_HEARTBEAT_MS`, so an idle worker costs the servers three heartbeats per
 * `IDLE_HEARTBEAT_MS` and three pull requests per `IDLE_PULL_MS`. The wait ends as soon as what
 * arrives says work is waiting (the item's `pending` count is not zero), when the worker runs
 * out of free slots, when an item comes with no slot for it, or when a pull may have been lost
 * (after a reconnect, or when a pull's heartbeats stop: its consumer's leader went away); then
 * the waiting pulls are withdrawn and the worker sweeps again. A withdrawn pull is one whose
 * reply subject nobody listens on any more: JetStream drops such a pull before it would deliver
 * to it.
 *
 * An idle wait does not hold slots: one worker waits on every pool and every priority at
 * once. Two items that reach the last free slot together leave one without a slot; it goes
 * back to the queue at once (a `nak`, so its delivery count grows by one).
 */
export class PoolPuller {
  private readonly nc: NatsConnection;
  private readonly levels: Level[];

  private constructor(
    topology: Topology,
    consumers: readonly { priority: Priority; subject: string; consumer: string }[],
    private readonly opts: PoolPullerOptions,
  ) {
    this.nc = topology.nc;
    this.levels = consumers.map(({ priority, subject, consumer }) => ({
      priority,
      subject,
      next: `$JS.API.CONSUMER.MSG.NEXT.${topology.names.streams.work}.${consumer}`,
      failing: false,
    }));
  }

  /** A pool's work: a consumer per priority. */
  static ofPool(topology: Topology, pool: string, opts: PoolPullerOptions): PoolPuller {
    const { names } = topology;
    const levels = PRIORITIES.map((priority) => ({
      priority,
      subject: names.subjects.work(pool, priority),
      consumer: names.poolConsumer(pool, priority),
    }));
    return new PoolPuller(topology, levels, opts);
  }

  /** The jobs to run in one worker's sessions: its own consumer (see `Topology.ensureWorkerConsumer`). */
  static ofSessions(topology: Topology, workerId: string, opts: PoolPullerOptions): PoolPuller {
    const { names } = topology;
    const level = { priority: "normal" as const, subject: names.subjects.sessionWork(workerId), consumer: names.workerConsumer(workerId) };
    return new PoolPuller(topology, [level], opts);
  }

  /**
   * Takes up to `max` waiting work items, highest priority first, handing each to `take` as it
   * arrives. Resolves with how many came. A consumer that cannot be pulled is logged and passed
   * over, so the others are still served; the sweep fails only when every consumer it asked did.
   */
  async take(max: number, take: TakeWork): Promise<number> {
    let taken = 0;
    let asked = 0;
    const failures: unknown[] = [];
    for (const level of this.levels) {
      const want = max - taken;
      if (want === 0) break;
      asked += 1;
      try {
        taken += await this.pull(level, want, take);
        if (level.failing) this.opts.log.info({ priority: level.priority }, "pulling work works again");
        level.failing = false;
      } catch (err) {
        failures.push(err);
        if (!level.failing) this.opts.log.warn({ err, priority: level.priority }, "pulling work failed; asking the other priorities");
        level.failing = true;
      }
    }
    if (failures.length > 0 && failures.length === asked && taken === 0) throw failures[0];
    return taken;
  }

  /**
   * Waits for work with a waiting pull on every priority, offering what comes to the worker,
   * until there is reason to sweep again (see the class comment) or `signal` aborts. A pull that
   * fails (the consumer is gone, or has too many waiting pulls: 409 Exceeded MaxWaiting) is
   * logged once and asked again after a pause; the other priorities wait on meanwhile.
   */
  waitForWork(wait: IdleWait): Promise<void> {
    const { log, idlePullMs = IDLE_PULL_MS, idleHeartbeatMs = IDLE_HEARTBEAT_MS } = this.opts;
    return new IdleSpell(this.nc, this.levels, wait, { pullMs: idlePullMs, heartbeatMs: idleHeartbeatMs, log }).run();
  }

  /**
   * One `no_wait` pull: up to `batch` items that are waiting now. JetStream ends it with a
   * status (404 none waiting, 408 fewer than asked) unless it sent the whole batch.
   */
  private pull(level: Level, batch: number, take: TakeWork): Promise<number> {
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
            take(WorkDelivery.from(nc, msg), level.priority);
          } catch (cause) {
            return end(cause as Error);
          }
          if (got === batch) end();
        },
      });
      const timer = setTimeout(
        () => end(new Error(`no answer from the ${level.priority} work consumer (${level.next}) in ${PULL_TIMEOUT_MS} ms`)),
        PULL_TIMEOUT_MS,
      );
      nc.publish(level.next, JSON.stringify({ batch, no_wait: true }), { reply: inbox });
    });
  }
}

/**
 * One idle wait: a waiting pull of one item on every priority, all answered on one inbox
 * (`<inbox>.<level>.<request>`, where a pull's status comes; an item comes with the subject it
 * was published to), renewed as they expire or deliver, until the wait ends. A pull may be lost
 * without a word: its consumer's leader went away with its server, or a restarted server
 * forgot it. So each pull asks for heartbeats, and one not heard from for two of them ends the
 * wait, as a reconnect does: the worker sweeps and waits afresh. (A new leader tells the pulls
 * it knows of, `409 Leadership Change`; those are asked again at once.) Ending the wait drains
 * the inbox: items already on their way are still offered, and JetStream drops the pulls
 * nobody listens for any more.
 */
class IdleSpell {
  private readonly inbox: string;
  /** The request each level waits on now, by level index; a status for an older one is stale. */
  private readonly current: number[];
  /** By level: the watch on its pull's heartbeats, or the pause before a failed pull is asked again. */
  private readonly timers: (NodeJS.Timeout | undefined)[];
  private requests = 0;
  private ended = false;
  private endSpell: (err?: unknown) => void = () => {};

  constructor(
    private readonly nc: NatsConnection,
    private readonly levels: Level[],
    private readonly wait: IdleWait,
    private readonly opts: { pullMs: number; heartbeatMs: number; log: Logger },
  ) {
    this.inbox = newInbox(nc);
    this.current = levels.map(() => 0);
    this.timers = levels.map(() => undefined);
  }

  async run(): Promise<void> {
    const { wait } = this;
    if (wait.signal.aborted) return;
    let outcome: unknown;
    const sub = this.nc.subscribe(`${this.inbox}.>`, { callback: (err, msg) => this.heard(err, msg) });
    const stopListening = wait.onFull(() => this.end());
    // Back after a reconnect, a pull may be gone with the server that held it: wait afresh.
    const status = this.nc.status() as AsyncIterable<Status> & { stop(): void };
    void (async () => {
      for await (const event of status) if (event.type === "reconnect") this.end();
    })();
    const aborted = () => this.end();
    wait.signal.addEventListener("abort", aborted, { once: true });
    try {
      await new Promise<void>((resolve, reject) => {
        this.endSpell = (err) => (err === undefined ? resolve() : reject(err));
        for (const i of this.levels.keys()) this.ask(i);
      });
    } catch (err) {
      outcome = err;
    } finally {
      this.ended = true;
      for (const timer of this.timers) clearTimeout(timer);
      stopListening();
      status.stop();
      wait.signal.removeEventListener("abort", aborted);
      // Withdraws the pulls; an item already on its way is still offered while the drain lasts.
      await sub.drain().catch(() => {});
    }
    if (outcome !== undefined) throw outcome;
  }

  private end(err?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.endSpell(err);
  }

  /** Sends level `i` a fresh waiting pull of one item. */
  private ask(i: number): void {
    if (this.ended) return;
    const level = this.levels[i] as Level;
    const request = ++this.requests;
    this.current[i] = request;
    this.watch(i);
    const body = { batch: 1, expires: nanos(this.opts.pullMs), idle_heartbeat: nanos(this.opts.heartbeatMs) };
    try {
      this.nc.publish(level.next, JSON.stringify(body), { reply: `${this.inbox}.${i}.${request}` });
    } catch (err) {
      this.end(err);
    }
  }

  /** Level `i`'s pull was heard from (or just sent): it counts as lost when nothing more comes for a heartbeat and a quarter. */
  private watch(i: number): void {
    clearTimeout(this.timers[i]);
    this.timers[i] = setTimeout(() => {
      const { priority } = this.levels[i] as Level;
      this.opts.log.info({ priority }, "a waiting pull went silent (its consumer's leader may have changed); waiting afresh");
      this.end();
    }, SILENT_HEARTBEATS * this.opts.heartbeatMs);
  }

  private heard(err: Error | null, msg: Msg): void {
    if (err) {
      this.end(err);
      return;
    }
    if (msg.reply) {
      // An item: it carries the subject it was published to, which names its priority.
      const i = this.levels.findIndex((l) => l.subject === msg.subject);
      if (i >= 0) this.offer(i, this.levels[i] as Level, msg);
      return;
    }
    // A status, sent to the pull's own reply subject: a heartbeat, or the pull ended without an item.
    const tokens = msg.subject.split(".");
    const i = Number(tokens[tokens.length - 2]);
    const request = Number(tokens[tokens.length - 1]);
    const level = this.levels[i];
    if (!level || this.ended || request !== this.current[i]) return;
    const code = msg.headers?.code ?? 0;
    if (code === 100) {
      this.watch(i);
      return;
    }
    if (code === 408) {
      this.works(level);
      this.ask(i);
      return;
    }
    if (code === 409 && msg.headers?.description === LEADERSHIP_CHANGE) {
      this.opts.log.info({ priority: level.priority }, "the work consumer has a new leader; asking it");
      this.ask(i);
      return;
    }
    const failure = pullStatusError(level, msg) ?? new Error(`pulling ${level.priority} work from ${level.next} ended with ${code}`);
    if (!level.failing) this.opts.log.warn({ err: failure, priority: level.priority }, "waiting for work failed; asking again in a moment");
    level.failing = true;
    this.wait.onPullFailed?.(failure);
    clearTimeout(this.timers[i]);
    this.timers[i] = setTimeout(() => this.ask(i), FAILED_PULL_PAUSE_MS);
  }

  private works(level: Level): void {
    if (level.failing) this.opts.log.info({ priority: level.priority }, "pulling work works again");
    level.failing = false;
  }

  private offer(i: number, level: Level, msg: Msg): void {
    let delivery: WorkDelivery;
    try {
      delivery = WorkDelivery.from(this.nc, msg);
    } catch (err) {
      this.end(err);
      return;
    }
    if (!this.wait.offer(delivery, level.priority)) {
      delivery.nak();
      this.end();
      return;
    }
    this.works(level);
    if (this.ended) return;
    // More waiting behind it: sweep, so what waits is taken in priority order.
    if (delivery.pending > 0) {
      this.end();
      return;
    }
    this.ask(i);
  }
}

/** The description of the status a consumer's new leader sends the waiting pulls it learned of from the old one. */
const LEADERSHIP_CHANGE = "Leadership Change";

const nanos = (ms: number): number => ms * 1_000_000;

/** A status that ends a pull: undefined for the ordinary ends (404, 408), else what went wrong. */
function pullStatusError(level: Level, msg: Msg): Error | undefined {
  const code = msg.headers?.code ?? 0;
  if (code === 404 || code === 408) return undefined;
  const why = code === 503 ? "no such consumer (no responders)" : `${code} ${msg.headers?.description ?? ""}`.trim();
  return new Error(`pulling ${level.priority} work from ${level.next} failed: ${why}`);
}
