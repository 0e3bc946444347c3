import { failSpan, SpanKind, startSpan, TRACEPARENT } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { isTransientJetStreamError } from "@boxcar/fabric/internal";
import { BoxcarError, ErrorCode, MAX_SPEC_BYTES, TOKEN_PATTERN, toErrorInfo } from "@boxcar/protocol";
import { decodeMessage, intakeSubjectParts } from "@boxcar/protocol/internal";
import { AckPolicy, type ConsumerMessages, type JsMsg } from "@nats-io/jetstream";
import { z } from "zod";
import { type AdmissionContext, admit, recordRejection } from "./admission.js";

/**
 * The durable intake (`<prefix>.submit.>`): the dispatchers share one consumer of it, which hands
 * each submission to one of them at a time, admitted by `admitIntake`. A submission that fails
 * is handed back, to be delivered again: at once, or in 5 s when the queue or the store is full.
 */
export class IntakeConsumer {
  private messages: ConsumerMessages | undefined;
  private done: Promise<void> = Promise.resolve();

  constructor(
    private readonly topology: Topology,
    private readonly ctx: AdmissionContext,
  ) {}

  /** Makes the shared consumer if it is missing, and admits its submissions as they come. */
  async start(): Promise<void> {
    const { topology, ctx } = this;
    const { jsm, js, names } = topology;
    const { log } = ctx;
    await jsm.consumers.info(names.streams.submit, names.intakeConsumer).catch((err: unknown) => {
      if (isTransientJetStreamError(err)) throw err;
      return jsm.consumers.add(names.streams.submit, {
        durable_name: names.intakeConsumer,
        ack_policy: AckPolicy.Explicit,
        ack_wait: topology.options.ackWaitMs * 1_000_000,
      });
    });
    const streamCreated = (await jsm.streams.info(names.streams.submit)).created;
    const consumer = await js.consumers.get(names.streams.submit, names.intakeConsumer);
    const messages = await consumer.consume({ max_messages: 64 });
    this.messages = messages;
    this.done = (async () => {
      for await (const msg of messages) {
        try {
          await admitIntake(topology, msg, streamCreated, ctx);
        } catch (err) {
          // A full queue or store is waited out: the submission stays in the stream until there is room.
          // A job kept without its work item (`accepted_pending`) is finished by the redelivery: its
          // key finds its record, and its item is published again.
          const waiting =
            err instanceof BoxcarError &&
            (err.code === ErrorCode.queueFull || err.code === ErrorCode.storageFull || err.code === ErrorCode.acceptedPending);
          if (waiting) log.warn({ seq: msg.seq, code: err.code }, "intake submission waits for room; it will be redelivered");
          else log.error({ err, seq: msg.seq }, "intake submission failed; it will be redelivered");
          msg.nak(waiting ? 5_000 : 1_000);
        }
      }
    })();
  }

  /** Takes no more submissions, and waits for the one under way. */
  async stop(): Promise<void> {
    await this.messages?.close();
    await this.done;
  }
}

/**
 * Admits one message from the durable intake stream `<prefix>.submit.<owner>.<agent>`. The agent comes
 * from the subject when the body names none. A bad submission is recorded as a rejected job (a
 * store with no room is not the submission's fault: it is tried again later);
 * either way the message is acked only once its outcome is stored, so a dispatcher that dies
 * midway leaves it for another to redo (deduplicated by the stream's creation time and sequence).
 */
export async function admitIntake(topology: Topology, msg: JsMsg, streamCreated: string, ctx: AdmissionContext): Promise<void> {
  const { log } = ctx;
  // NATS permissions let a user publish only on its own `<prefix>.submit.<user>.<agent>`.
  const parts = intakeSubjectParts(topology.names, msg.subject);
  const owner = parts?.owner ?? "_invalid_";
  const agent = parts?.agent ?? msg.subject.slice(msg.subject.lastIndexOf(".") + 1);
  // Sequences restart if the stream is recreated; its creation time keeps keys unique.
  const implicitKey = `intake:${topology.names.prefix}:${streamCreated}:${msg.seq}`;
  // A span for the submission, joining the publisher's trace when its message carries one.
  const { span, traceparent } = startSpan("intake", msg.headers?.get(TRACEPARENT) || undefined, {
    kind: SpanKind.CONSUMER,
    attributes: {
      "messaging.system": "nats",
      "messaging.operation.type": "process",
      "messaging.destination.name": msg.subject,
      "messaging.consumer.group.name": topology.names.intakeConsumer,
    },
  });
  try {
    // An empty body is an empty spec, as on the request/reply API: the subject names the agent.
    const body = msg.data.byteLength === 0 ? {} : decodeMessage(z.unknown(), msg.data, "submission", MAX_SPEC_BYTES);
    const spec = body !== null && typeof body === "object" && !Array.isArray(body) ? { ...body, agent: agentFromBody(body, agent) } : body;
    if (!parts) throw new BoxcarError(ErrorCode.invalid, `${msg.subject} is not <prefix>.submit.<user>.<agent>`);
    const { job } = await admit(topology, spec, ctx, { owner, implicitKey, ...(traceparent ? { traceparent } : {}) });
    span.setAttribute("boxcar.job.id", job.id);
    log.debug({ jobId: job.id, seq: msg.seq }, "intake admitted");
  } catch (err) {
    const error = toErrorInfo(err);
    failSpan(span, error);
    // Not the submission's fault: it stays in the stream and is tried again (a full queue or store
    // frees up, a rate limit has room, JetStream answers again).
    const later: string[] = [
      ErrorCode.internal,
      ErrorCode.queueFull,
      ErrorCode.storageFull,
      ErrorCode.acceptedPending,
      ErrorCode.unavailable,
    ];
    if (later.includes(error.code)) throw err;
    const job = await recordRejection(topology, TOKEN_PATTERN.test(agent) ? agent : "_invalid_", owner, error, implicitKey);
    log.warn({ jobId: job.id, seq: msg.seq, code: error.code, reason: error.message }, "intake submission rejected");
  } finally {
    span.end();
  }
  msg.ack();
}

/** The subject names the agent; a body that names another one is refused rather than guessed at. */
function agentFromBody(body: object, subjectAgent: string): string {
  const named = (body as { agent?: unknown }).agent;
  if (named !== undefined && named !== subjectAgent) {
    throw new BoxcarError(
      ErrorCode.invalid,
      `the body names agent ${JSON.stringify(named)} but was sent to the intake of ${subjectAgent}`,
      {
        issues: [{ path: "agent", message: "does not match the subject" }],
      },
    );
  }
  return subjectAgent;
}
