import type { Logger } from "@boxcar/common";
import type { Topology, WorkSigner } from "@boxcar/fabric";
import { nowIso, storedMessages } from "@boxcar/fabric/internal";
import { BoxcarError, ErrorCode, isTerminal, type JobRecord, parseWith, WorkItem } from "@boxcar/protocol";
import { JobTransitions } from "@boxcar/protocol/internal";
import { AckPolicy, JetStreamApiCodes, JetStreamApiError, type StoredMsg } from "@nats-io/jetstream";
import { z } from "zod";
import { publishWork } from "../jobs/work-items.js";
import { Sweep } from "../loops/sweep.js";

/** What JetStream publishes when a consumer stops delivering a message (`io.nats.jetstream.advisory.v1.max_deliver`). */
const MaxDeliveriesAdvisory = z.looseObject({
  stream: z.string(),
  consumer: z.string(),
  stream_seq: z.number().int().positive(),
  deliveries: z.number().int().nonnegative(),
});

/**
 * Keeps work items that JetStream gives up on (a pool consumer's `max_deliver`, see
 * `maxDeliveries`) from vanishing. Such an item stays in the work stream, delivered to nobody;
 * the job it belongs to is settled:
 *
 * - **running** (its workers kept stopping without finishing it, e.g. they crashed): the job
 *   ends `dead` by compare-and-swap, with a `dead` event and a copy in the dead-letter stream;
 * - **queued** (its deliveries went to retries' backoffs or to workers that handed it back): it is
 *   enqueued again as a fresh message, so a retry policy or a busy pool is not cut short;
 * - **final** already, or without a record: nothing is left to do.
 *
 * and the given-up message leaves the work stream.
 *
 * Two ways find such an item. The fast one is the advisory JetStream publishes the moment it
 * gives up; every dispatcher receives it. But the advisory is not stored: a dispatcher that was
 * not running, or that could not act on it (a cluster electing leaders answers "JetStream system
 * temporarily unavailable"), would leave the job stuck for good. So each dispatcher also sweeps:
 * an item still in the work stream at or below its consumer's ack floor is one its consumer
 * stopped delivering (an acknowledged item leaves a work-queue stream). While all is well a
 * sweep costs one consumer list and one message read per pool consumer. The floor stays below
 * an item still being worked on: a given-up item above one that a long job holds is found once
 * that job ends (the advisory finds it at once). An item is settled when two sweeps in a row
 * find it, so one whose acknowledgement the stream has not applied yet is never taken for given
 * up.
 *
 * Dispatchers may settle the same item at once: the compare-and-swap lets one end the job, and
 * only the one whose delete removed the item enqueues the fresh copy.
 */
export class GivenUpSweep {
  private readonly sweeps: Sweep<number>;
  /** Items the last sweep found given up, by stream sequence: the next sweep settles those still there. */
  private suspects = new Set<number>();
  private advisories: { unsubscribe(): void; done: Promise<void> } | undefined;
  private closing: Promise<void> | undefined;

  /** Sweeps every `intervalMs` once started; `onDead` hears of each job this dispatcher ended `dead`. */
  constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
    private readonly signer: WorkSigner | undefined,
    intervalMs: number,
    private readonly onDead: (job: JobRecord) => void = () => {},
  ) {
    this.sweeps = new Sweep({
      pass: (signal) => this.sweepOnce(signal),
      intervalMs,
      onError: (err) => log.warn({ err }, "could not sweep the work stream for given-up items"),
    });
  }

  /** Listens for JetStream's advisories, then sets the sweep's timer. */
  async start(): Promise<void> {
    const { topology, log } = this;
    const stream = topology.names.streams.work;
    const subject = `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${stream}.>`;
    const sub = topology.nc.subscribe(subject);
    // Advisories are acted on once the subscription is known to be in place.
    let listening = false;
    const done = (async () => {
      for await (const msg of sub) {
        let advisory: z.infer<typeof MaxDeliveriesAdvisory>;
        try {
          advisory = parseWith(MaxDeliveriesAdvisory, msg.json(), "max deliveries advisory");
        } catch (err) {
          log.warn({ err, subject: msg.subject }, "ignoring an advisory that cannot be read");
          continue;
        }
        if (advisory.stream !== stream || !listening) continue;
        const { stream_seq: seq, consumer, deliveries } = advisory;
        await this.settleSeq(seq, { consumer, deliveries }).catch((err: unknown) =>
          log.warn({ err, seq }, "could not settle a work item JetStream gave up on; a sweep will"),
        );
      }
    })();
    // The subscription is in place on the server before the caller goes on; a credential that
    // may not subscribe there is an error now, not a silent gap.
    try {
      await topology.nc.flush();
    } catch (err) {
      sub.unsubscribe();
      throw err;
    }
    if (sub.isClosed()) {
      await done.catch(() => {});
      throw new BoxcarError(ErrorCode.forbidden, `cannot subscribe to ${subject}: this credential's permissions do not allow it`);
    }
    log.debug({ subject }, "watching for work items JetStream gives up on");
    listening = true;
    this.advisories = { unsubscribe: () => sub.unsubscribe(), done };
    this.sweeps.start();
  }

  /** Sweeps now; resolves with how many given-up items it settled. */
  run(): Promise<number> {
    return this.sweeps.run();
  }

  /** Stops listening and sweeping, and waits for what is under way; safe to call twice. */
  stop(): Promise<void> {
    this.closing ??= (async () => {
      const sweeps = this.sweeps.stop();
      this.advisories?.unsubscribe();
      await this.advisories?.done;
      await sweeps;
    })();
    return this.closing;
  }

  private async sweepOnce(signal: AbortSignal): Promise<number> {
    const { jsm, names } = this.topology;
    const stream = names.streams.work;
    const found = new Set<number>();
    let settled = 0;
    for await (const info of jsm.consumers.list(stream)) {
      const filter = info.config.filter_subject;
      // Only the pool consumers: another consumer's ack floor says nothing of what workers took.
      if (!names.poolOfConsumer(info.name) || info.config.ack_policy !== AckPolicy.Explicit || !filter) continue;
      for await (const stored of storedMessages(jsm, stream, filter, { upTo: info.ack_floor.stream_seq })) {
        if (signal.aborted) break;
        if (this.suspects.has(stored.seq)) {
          // One item that cannot be settled (unreadable, say) does not hold up the others.
          await this.settle(stored, { consumer: info.name, deliveries: info.config.max_deliver ?? 0 }).then(
            () => (settled += 1),
            (err: unknown) => this.log.warn({ err, seq: stored.seq }, "could not settle a work item JetStream gave up on"),
          );
        } else {
          found.add(stored.seq);
        }
      }
    }
    this.suspects = found;
    return settled;
  }

  private async settleSeq(seq: number, why: { consumer: string; deliveries: number }): Promise<void> {
    const stored = await this.topology.jsm.streams.getMessage(this.topology.names.streams.work, { seq });
    if (!stored) {
      this.log.debug({ seq }, "the given-up work item is gone already");
      return;
    }
    await this.settle(stored, why);
  }

  private async settle(stored: StoredMsg, why: { consumer: string; deliveries: number }): Promise<void> {
    const { topology, signer } = this;
    const { seq } = stored;
    const item = parseWith(WorkItem, stored.json(), "work item");
    const jobId = item.jobId;
    const log = this.log.child({ seq, jobId, ...why });

    const change = await topology.jobStore.change(jobId, (job) => JobTransitions.buryUndelivered(job, why.deliveries, nowIso()));
    const waiting = change.written ? undefined : change.current?.record;
    if (waiting && !isTerminal(waiting.state)) {
      // Still waiting to run: its deliveries were used up by backoffs and hand-backs, not by
      // failures. The old item goes first: should the fresh one then fail to be stored, the
      // job is one without a work item, which `RecoverySweep` enqueues again.
      if (!(await this.remove(seq, log))) return;
      await publishWork(topology, stored.subject, stored.data, signer, `${jobId}:redelivery:${seq}`);
      log.warn({ state: waiting.state, attempt: waiting.attempt }, "JetStream gave up on a waiting job's work item; enqueued it again");
      return;
    }
    if (!change.written) {
      log.info({ state: change.current?.record.state }, "JetStream gave up on the work item of a job that has ended; removing it");
      await this.remove(seq, log);
      return;
    }
    const dead = change.handle.record;
    this.onDead(dead);
    await topology.js
      .publish(topology.names.subjects.dead(dead.agent), JSON.stringify(dead), { msgID: `${jobId}:dead:${seq}` })
      .catch((err: unknown) => log.error({ err }, "could not keep the dead job in the dead-letter stream"));
    log.warn({ attempt: dead.attempt, workerId: dead.workerId }, "job is dead: JetStream gave up on its work item");
    await this.remove(seq, log);
  }

  /** Deletes the given-up item; false if another dispatcher removed it first. Any other failure throws (a sweep tries again). */
  private async remove(seq: number, log: Logger): Promise<boolean> {
    try {
      await this.topology.jsm.streams.deleteMessage(this.topology.names.streams.work, seq, false);
      return true;
    } catch (err) {
      // 10057: the server's "no message found" on delete.
      if (err instanceof JetStreamApiError && (err.code === JetStreamApiCodes.NoMessageFound || err.code === 10057)) {
        log.debug({}, "the given-up work item was removed by another dispatcher");
        return false;
      }
      throw err;
    }
  }
}
