import type { Logger } from "@boxcar/client";
import { jobEvent, nowIso, publishEvent, type Topology, type WorkSigner } from "@boxcar/fabric";
import { BoxcarError, ErrorCode, isTerminal, type JobRecord, JobTransitions, parseWith, WorkItem } from "@boxcar/protocol";
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";
import { z } from "zod";
import { publishWork } from "./admission.js";

/** What JetStream publishes when a consumer stops delivering a message (`io.nats.jetstream.advisory.v1.max_deliver`). */
const MaxDeliveriesAdvisory = z.looseObject({
  stream: z.string(),
  consumer: z.string(),
  stream_seq: z.number().int().positive(),
  deliveries: z.number().int().nonnegative(),
});
type MaxDeliveriesAdvisory = z.infer<typeof MaxDeliveriesAdvisory>;

export interface MaxDeliveriesWatch {
  /** Stops listening and waits for the advisory in hand; safe to call twice. */
  close(): Promise<void>;
}

/**
 * Keeps work items that JetStream gives up on (a pool consumer's `max_deliver`, see
 * `maxDeliveries`) from vanishing. Such an item stays in the work stream, delivered to nobody;
 * on the advisory JetStream publishes for it, the job it belongs to is settled:
 *
 * - **running** (its workers kept stopping without finishing it, e.g. they crashed): the job
 *   ends `dead` by compare-and-swap, with a `dead` event and a copy in the dead-letter stream;
 * - **queued** (its deliveries went to retries' backoffs or to workers that handed it back): it is
 *   enqueued again as a fresh message, so a retry policy or a busy pool is not cut short;
 * - **final** already, or without a record: nothing is left to do.
 *
 * In every case the given-up message is then deleted from the work stream. Every dispatcher
 * receives the advisory; the compare-and-swap makes one of them end the job, and the fresh
 * message's id (job id and the old message's sequence) makes the stream keep one copy.
 */
export async function startMaxDeliveriesWatch(
  topology: Topology,
  log: Logger,
  signer: WorkSigner | undefined,
): Promise<MaxDeliveriesWatch> {
  const stream = topology.names.streams.work;
  const subject = `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${stream}.>`;
  const sub = topology.nc.subscribe(subject);
  const done = (async () => {
    for await (const msg of sub) {
      let advisory: MaxDeliveriesAdvisory;
      try {
        advisory = parseWith(MaxDeliveriesAdvisory, msg.json(), "max deliveries advisory");
      } catch (err) {
        log.warn({ err, subject: msg.subject }, "ignoring an advisory that cannot be read");
        continue;
      }
      if (advisory.stream !== stream) continue;
      await settle(topology, advisory, log, signer).catch((err: unknown) =>
        log.error({ err, seq: advisory.stream_seq }, "could not settle a work item JetStream gave up on"),
      );
    }
  })();
  // The subscription is in place on the server before the caller goes on; a credential that
  // may not subscribe there is an error now, not a silent gap.
  await topology.nc.flush();
  if (sub.isClosed()) {
    await done.catch(() => {});
    throw new BoxcarError(ErrorCode.forbidden, `cannot subscribe to ${subject}: this credential's permissions do not allow it`);
  }
  log.debug({ subject }, "watching for work items JetStream gives up on");

  let closing: Promise<void> | undefined;
  return {
    close: () =>
      (closing ??= (async () => {
        sub.unsubscribe();
        await done;
      })()),
  };
}

async function settle(
  topology: Topology,
  advisory: MaxDeliveriesAdvisory,
  parentLog: Logger,
  signer: WorkSigner | undefined,
): Promise<void> {
  const { stream_seq: seq, deliveries } = advisory;
  let log = parentLog.child({ seq, consumer: advisory.consumer, deliveries });
  const stored = await topology.jsm.streams.getMessage(topology.names.streams.work, { seq });
  if (!stored) {
    log.debug({}, "the given-up work item is gone already");
    return;
  }
  const item = parseWith(WorkItem, stored.json(), "work item");
  const jobId = item.jobId;
  log = log.child({ jobId });

  let waiting: JobRecord | undefined;
  const change = await topology.jobStore.change(jobId, (job) => {
    waiting = undefined;
    if (isTerminal(job.state)) return null;
    if (job.state !== "running") {
      waiting = job;
      return null;
    }
    return JobTransitions.buryUndelivered(job, deliveries, nowIso());
  });
  if (waiting) {
    // Still waiting to run: its deliveries were used up by backoffs and hand-backs, not by failures.
    await publishWork(topology, stored.subject, stored.data, signer, `${jobId}:redelivery:${seq}`);
    log.warn({ state: waiting.state, attempt: waiting.attempt }, "JetStream gave up on a waiting job's work item; enqueued it again");
    return deleteWorkItem(topology, seq, log);
  }
  if (!change.written) {
    log.info({ state: change.current?.record.state }, "JetStream gave up on the work item of a job that has ended; removing it");
    return deleteWorkItem(topology, seq, log);
  }
  const dead = change.handle.record;
  await publishEvent(
    topology,
    jobEvent(dead, "dead", { message: dead.error?.message ?? "dead", ...(dead.error ? { error: dead.error } : {}) }),
  );
  await topology.js
    .publish(topology.names.subjects.dead(dead.agent), JSON.stringify(dead), { msgID: `${jobId}:dead:${seq}` })
    .catch((err: unknown) => log.error({ err }, "could not keep the dead job in the dead-letter stream"));
  log.warn({ attempt: dead.attempt, workerId: dead.workerId }, "job is dead: JetStream gave up on its work item");
  return deleteWorkItem(topology, seq, log);
}

async function deleteWorkItem(topology: Topology, seq: number, log: Logger): Promise<void> {
  try {
    await topology.jsm.streams.deleteMessage(topology.names.streams.work, seq, false);
  } catch (err) {
    // Another dispatcher removed it first (10057: the server's "no message found" on delete).
    if (err instanceof JetStreamApiError && (err.code === JetStreamApiCodes.NoMessageFound || err.code === 10057)) return;
    log.warn({ err }, "could not remove the given-up work item from the work stream");
  }
}
