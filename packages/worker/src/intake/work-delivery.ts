import type { Msg, MsgHdrs, NatsConnection } from "@nats-io/transport-node";

/**
 * One delivery of a work item from a pool consumer, and the replies that settle it. JetStream
 * puts the delivery's facts in its reply subject, the one acknowledgements go to:
 * `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`, or
 * with `<domain>.<account hash>.` after `$JS.ACK.` and a trailing token on newer servers.
 *
 * The first of `ack`, `nak` and `term` settles the delivery; later ones are ignored, so a run
 * that ends two ways at once cannot send JetStream both. `working` only extends the lease.
 */
export class WorkDelivery {
  readonly subject: string;
  readonly data: Uint8Array;
  readonly headers: MsgHdrs | undefined;
  /** The item's sequence in the work stream. */
  readonly seq: number;
  /** How many times JetStream has delivered this item, this delivery included. */
  readonly deliveryCount: number;
  /** How many items the consumer still had waiting, not yet delivered, when it sent this one. */
  readonly pending: number;
  private settled = false;

  private constructor(
    private readonly nc: NatsConnection,
    private readonly ackSubject: string,
    msg: Msg,
    facts: DeliveryFacts,
  ) {
    this.subject = msg.subject;
    this.data = msg.data;
    this.headers = msg.headers;
    this.seq = facts.seq;
    this.deliveryCount = facts.deliveryCount;
    this.pending = facts.pending;
  }

  /** The delivery a pull brought; throws when its reply subject is not a JetStream ack subject. */
  static from(nc: NatsConnection, msg: Msg): WorkDelivery {
    const reply = msg.reply ?? "";
    return new WorkDelivery(nc, reply, msg, deliveryFacts(reply));
  }

  /** Done with: JetStream removes the item. */
  ack(): void {
    this.settle("+ACK");
  }

  /** Give the item back, to be delivered again at once or after `delayMs`. */
  nak(delayMs?: number): void {
    this.settle(delayMs ? nakWithDelay(delayMs) : "-NAK");
  }

  /** Never deliver the item again. */
  term(reason?: string): void {
    this.settle(reason ? `+TERM ${reason}` : "+TERM");
  }

  /** Still at it: restarts the lease (ack wait) without settling. */
  working(): void {
    if (!this.settled) this.nc.publish(this.ackSubject, "+WPI");
  }

  /** Sends the settling reply; false when the delivery was settled already. */
  private settle(reply: string): boolean {
    if (this.settled) return false;
    this.settled = true;
    this.nc.publish(this.ackSubject, reply);
    return true;
  }
}

interface DeliveryFacts {
  seq: number;
  deliveryCount: number;
  pending: number;
}

/** What a delivery's reply subject says of it (see `WorkDelivery`); throws when it is not a JetStream ack subject. */
export function deliveryFacts(reply: string): DeliveryFacts {
  const tokens = reply.split(".");
  const at = tokens.length === 9 ? 2 : tokens.length >= 11 ? 4 : -1;
  const deliveryCount = Number(tokens[at + 2]);
  const seq = Number(tokens[at + 3]);
  const pending = Number(tokens[at + 6]);
  if (tokens[0] !== "$JS" || tokens[1] !== "ACK" || at < 0 || !(deliveryCount >= 1) || !(seq >= 1) || !(pending >= 0)) {
    throw new Error(`not a JetStream delivery: reply subject ${JSON.stringify(reply)}`);
  }
  return { seq, deliveryCount, pending };
}

const nakWithDelay = (delayMs: number): string => `-NAK ${JSON.stringify({ delay: Math.round(delayMs * 1_000_000) })}`;
