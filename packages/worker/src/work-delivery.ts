import type { Msg, MsgHdrs, NatsConnection } from "@nats-io/transport-node";

/**
 * One delivery of a work item from a pool consumer, and the replies that settle it. JetStream
 * puts the delivery's facts in its reply subject, the one acknowledgements go to:
 * `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`, or
 * with `<domain>.<account hash>.` after `$JS.ACK.` and a trailing token on newer servers.
 *
 * The first of `ack`, `nak` and `term` settles the delivery; later ones are ignored, so a run
 * that ends two ways at once cannot send JetStream both. `working` only extends the lease.
 * `onRequeue` hears of every `nak`, with the delay after which the item is due again (not of a
 * `passOn`).
 */
export class WorkDelivery {
  readonly subject: string;
  readonly data: Uint8Array;
  readonly headers: MsgHdrs | undefined;
  /** The item's sequence in the work stream. */
  readonly seq: number;
  /** How many times JetStream has delivered this item, this delivery included. */
  readonly deliveryCount: number;
  private settled = false;

  private constructor(
    private readonly nc: NatsConnection,
    private readonly ackSubject: string,
    private readonly onRequeue: (delayMs: number) => void,
    msg: Msg,
    facts: { seq: number; deliveryCount: number },
  ) {
    this.subject = msg.subject;
    this.data = msg.data;
    this.headers = msg.headers;
    this.seq = facts.seq;
    this.deliveryCount = facts.deliveryCount;
  }

  /** The delivery a pull brought; throws when its reply subject is not a JetStream ack subject. */
  static from(nc: NatsConnection, msg: Msg, onRequeue: (delayMs: number) => void = () => {}): WorkDelivery {
    const reply = msg.reply ?? "";
    return new WorkDelivery(nc, reply, onRequeue, msg, deliveryFacts(reply));
  }

  /** Done with: JetStream removes the item. */
  ack(): void {
    this.settle("+ACK");
  }

  /** Give the item back, to be delivered again at once or after `delayMs`. */
  nak(delayMs?: number): void {
    if (this.settle(delayMs ? nakWithDelay(delayMs) : "-NAK")) this.onRequeue(delayMs ?? 0);
  }

  /**
   * Give the item back for another worker to take after `delayMs`: a `nak` that `onRequeue`
   * does not hear of, so this worker does not wait for the item to come due.
   */
  passOn(delayMs: number): void {
    this.settle(nakWithDelay(delayMs));
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

/** What a delivery's reply subject says of it (see `WorkDelivery`); throws when it is not a JetStream ack subject. */
export function deliveryFacts(reply: string): { seq: number; deliveryCount: number } {
  const tokens = reply.split(".");
  const at = tokens.length === 9 ? 2 : tokens.length >= 11 ? 4 : -1;
  const deliveryCount = Number(tokens[at + 2]);
  const seq = Number(tokens[at + 3]);
  if (tokens[0] !== "$JS" || tokens[1] !== "ACK" || at < 0 || !(deliveryCount >= 1) || !(seq >= 1)) {
    throw new Error(`not a JetStream delivery: reply subject ${JSON.stringify(reply)}`);
  }
  return { seq, deliveryCount };
}

const nakWithDelay = (delayMs: number): string => `-NAK ${JSON.stringify({ delay: Math.round(delayMs * 1_000_000) })}`;
