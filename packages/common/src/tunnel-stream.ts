/**
 * One end of a tunnel over NATS (docs/sessions.md#ports): a byte stream, a TCP connection's, as
 * core NATS messages, one subject each way, seen as a Node `Duplex`. The caller's end (the SDK)
 * and the session's end (its worker) are the same code.
 *
 * Each message carries up to `chunkBytes` of data and these headers:
 *
 * - `Boxcar-Seq`: its number, from 1, each way. Core NATS keeps one publisher's order to one
 *   subscriber but may drop messages (a slow consumer, a reconnect): a gap ends the tunnel
 *   (`tunnel_lost`), since nothing is sent again.
 * - `Boxcar-Ack`: how many bytes of the other way this end has taken so far. An end sends at
 *   most `windowBytes` the other has not acknowledged, then waits; the other acknowledges while
 *   its reader wants more (what waits unread stays under a message's worth), so a slow reader
 *   holds the writer back and neither keeps more than a window and two messages of the other's
 *   bytes; one that sends past that ends the tunnel (`tunnel_overrun`).
 * - `Boxcar-End`: this end sends no more (a TCP half-close); its data, if any, comes first.
 * - `Boxcar-Reset`: this end is gone (the connection failed, or was dropped), with why.
 * - What a tunnel's use adds (a shell's `Boxcar-Resize` and `Boxcar-Exit`): an end sends them with
 *   `control` (a message of its own, numbered as the others) or `endWith` (on its end), and the
 *   other hears those it names in `controls` as a `control` event, in order with the bytes.
 *
 * An end that has said nothing for `heartbeatMs` sends an empty message (its acknowledgement), and
 * one that hears nothing for `silenceMs` ends the tunnel (`tunnel_silent`): a caller that went
 * away does not hold a connection in the session open.
 *
 * Nothing here is answered: a message's reply subject is its sender's to choose.
 */

import { Duplex } from "node:stream";
import { type Msg, type NatsConnection, headers as natsHeaders, type Subscription } from "@nats-io/transport-node";

/** The headers of a tunnel's messages. */
export const TunnelHeader = {
  seq: "Boxcar-Seq",
  ack: "Boxcar-Ack",
  end: "Boxcar-End",
  reset: "Boxcar-Reset",
  /** A shell's terminal changed size: `COLSxROWS` (from the caller). */
  resize: "Boxcar-Resize",
  /** A shell ended, on its tunnel's end: its exit code, or the signal that ended it (from the session). */
  exit: "Boxcar-Exit",
} as const;
export type TunnelHeader = (typeof TunnelHeader)[keyof typeof TunnelHeader];

/** Why a tunnel ended before both its ends were done. */
export const TunnelErrorCode = {
  /** The other end closed the connection (its `Boxcar-Reset`). */
  reset: "tunnel_reset",
  /** A message went missing. */
  lost: "tunnel_lost",
  /** Nothing was heard from the other end for `silenceMs`. */
  silent: "tunnel_silent",
  /** The other end sent past its window, or broke the tunnel's rules. */
  overrun: "tunnel_overrun",
} as const;
export type TunnelErrorCode = (typeof TunnelErrorCode)[keyof typeof TunnelErrorCode];

export class TunnelError extends Error {
  override readonly name = "TunnelError";
  constructor(
    readonly code: TunnelErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export interface TunnelStreamOptions {
  /** Where this end's bytes go, and where the other end's come. */
  send: string;
  receive: string;
  /** The most bytes sent and not yet acknowledged. */
  windowBytes: number;
  /** The most bytes in one message. */
  chunkBytes: number;
  /** Default 5 s. */
  heartbeatMs?: number;
  /** Default 20 s. */
  silenceMs?: number;
  /** Called as bytes go through, either way. */
  onTraffic?: () => void;
  /** Headers of the other end's messages heard as a `control` event (a record of those a message has). */
  controls?: readonly string[];
}

const EMPTY = new Uint8Array(0);
/** How long a small acknowledgement waits for more to go with it. */
const ACK_DELAY_MS = 10;

/**
 * One end of a tunnel. It listens on `receive` from the start (the caller's end subscribes
 * before it asks for the tunnel, so the session's first bytes are not missed), and sends once
 * `open()` is called: the other end is there.
 */
export class TunnelStream extends Duplex {
  private readonly sub: Subscription;
  private readonly heartbeatMs: number;
  private readonly silenceMs: number;
  private opened = false;
  private seqOut = 0;
  private seqIn = 0;
  /** Bytes sent, and how many of them the other end said it took. */
  private sent = 0;
  private acked = 0;
  /** Bytes received; how many of them this end takes (its reader wants more), and last said it took. */
  private received = 0;
  private taken = 0;
  private ackSaid = 0;
  /** A write waiting for the window: the rest of its chunk, and its callback once all of it is sent. */
  private pending: { chunk: Buffer; at: number; done: (error?: Error | null) => void } | undefined;
  private endSent = false;
  private endHeard = false;
  /** Headers this end's last message (its end) carries, set by `endWith`. */
  private trailer: Record<string, string> | undefined;
  /** The other end reset the tunnel: nothing is said back. */
  private peerGone = false;
  private heardAt = Date.now();
  private saidAt = Date.now();
  private ticker: NodeJS.Timeout | undefined;
  private ackTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly opts: TunnelStreamOptions,
  ) {
    // Little waits unread before the reader is asked again: what one end holds of the other's is a
    // window and two messages at most.
    super({ allowHalfOpen: true, readableHighWaterMark: opts.chunkBytes, writableHighWaterMark: opts.chunkBytes });
    this.heartbeatMs = opts.heartbeatMs ?? 5_000;
    this.silenceMs = opts.silenceMs ?? 20_000;
    this.sub = nc.subscribe(opts.receive, {
      callback: (err, msg) => {
        if (err) this.destroy(err);
        else this.heard(msg);
      },
    });
  }

  /** The other end is there: this end may send, and listens for its silence. Says so with a first (empty) message. */
  open(): void {
    if (this.opened || this.destroyed) return;
    this.opened = true;
    this.heardAt = Date.now();
    this.say();
    this.ticker = setInterval(() => this.tick(), Math.max(50, Math.floor(this.heartbeatMs / 2)));
    this.ticker.unref?.();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    if (!this.opened) {
      callback(new Error("the tunnel is not open yet"));
      return;
    }
    this.pending = { chunk, at: 0, done: callback };
    this.opts.onTraffic?.();
    this.pump();
  }

  /** Sends what is pending while the window has room (past it by a message's data at most); its write is done once all is sent. */
  private pump(): void {
    const pending = this.pending;
    if (!pending) return;
    try {
      while (pending.at < pending.chunk.length && this.sent - this.acked < this.opts.windowBytes) {
        const part = pending.chunk.subarray(pending.at, pending.at + this.opts.chunkBytes);
        pending.at += part.length;
        this.sent += part.length;
        this.say(part);
      }
    } catch (err) {
      this.pending = undefined;
      pending.done(err as Error);
      return;
    }
    if (pending.at < pending.chunk.length) return;
    this.pending = undefined;
    pending.done();
  }

  /**
   * Sends `fields` (headers, one line each) in a message of their own, after the bytes sent so far
   * (a write waiting for the window goes after it): the other end hears them as a `control` event,
   * if it listens for them.
   */
  control(fields: Readonly<Record<string, string>>): void {
    if (!this.opened || this.destroyed || this.endSent) throw new Error("the tunnel is not open");
    this.say(EMPTY, { extra: fields });
  }

  /** Ends this side (as `end()`), its last message carrying `fields`. */
  endWith(fields: Readonly<Record<string, string>>): void {
    this.trailer = { ...fields };
    this.end();
  }

  override _final(callback: (error?: Error | null) => void): void {
    try {
      this.say(EMPTY, { end: true, ...(this.trailer ? { extra: this.trailer } : {}) });
      this.endSent = true;
      callback();
    } catch (err) {
      callback(err as Error);
    }
  }

  override _read(): void {
    // The reader wants more: all that came is taken (what waits unread is under a message's worth).
    this.taken = this.received;
    this.acknowledge();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    clearInterval(this.ticker);
    clearTimeout(this.ackTimer);
    this.pending = undefined;
    // Both ways ended: a clean close. Otherwise the other end is told, unless it is the one gone.
    if (!(this.endSent && this.endHeard) && !this.peerGone) {
      try {
        this.say(EMPTY, { reset: error?.message ?? "closed" });
      } catch {
        // the connection to NATS is gone: the other end hears silence
      }
    }
    this.sub.unsubscribe();
    callback(error);
  }

  /** Publishes one message: `data`, this end's acknowledgement, and its end or reset. */
  private say(data: Uint8Array = EMPTY, flags: { end?: boolean; reset?: string; extra?: Readonly<Record<string, string>> } = {}): void {
    const h = natsHeaders();
    for (const [name, value] of Object.entries(flags.extra ?? {})) h.set(name, oneLine(value));
    this.seqOut += 1;
    h.set(TunnelHeader.seq, String(this.seqOut));
    const taken = this.taken;
    h.set(TunnelHeader.ack, String(taken));
    if (flags.end) h.set(TunnelHeader.end, "1");
    if (flags.reset !== undefined) h.set(TunnelHeader.reset, oneLine(flags.reset) || "closed");
    this.nc.publish(this.opts.send, data, { headers: h });
    this.ackSaid = taken;
    this.saidAt = Date.now();
  }

  /** Says what was taken, at once when it is a quarter of the window, else shortly (with more, if more comes). */
  private acknowledge(): void {
    if (!this.opened || this.destroyed) return;
    const owed = this.taken - this.ackSaid;
    if (owed <= 0) return;
    if (owed >= this.opts.windowBytes / 4) {
      clearTimeout(this.ackTimer);
      this.ackTimer = undefined;
      this.sayQuietly();
    } else
      this.ackTimer ??= setTimeout(() => {
        this.ackTimer = undefined;
        if (this.taken > this.ackSaid) this.sayQuietly();
      }, ACK_DELAY_MS);
  }

  private sayQuietly(): void {
    try {
      this.say();
    } catch (err) {
      this.destroy(err as Error);
    }
  }

  private tick(): void {
    // Both ways ended: nothing more is owed either way (what is left waits for this end's reader).
    if (this.endSent && this.endHeard) return;
    const now = Date.now();
    if (now - this.heardAt > this.silenceMs) {
      this.destroy(new TunnelError(TunnelErrorCode.silent, `nothing heard from the tunnel's other end for ${this.silenceMs / 1000} s`));
    } else if (now - this.saidAt >= this.heartbeatMs) this.sayQuietly();
  }

  private heard(msg: Msg): void {
    if (this.destroyed) return;
    this.heardAt = Date.now();
    const h = msg.headers;
    const seq = Number(h?.get(TunnelHeader.seq));
    if (seq !== this.seqIn + 1) {
      this.destroy(new TunnelError(TunnelErrorCode.lost, `the tunnel lost messages (message ${seq} came after ${this.seqIn})`));
      return;
    }
    this.seqIn = seq;
    if (h?.has(TunnelHeader.reset)) {
      this.peerGone = true;
      this.destroy(new TunnelError(TunnelErrorCode.reset, `the connection was closed at the other end: ${h.get(TunnelHeader.reset)}`));
      return;
    }
    // Cumulative: a message without one acknowledges nothing more.
    const said = h?.get(TunnelHeader.ack);
    const ack = said ? Number(said) : this.acked;
    if (!Number.isSafeInteger(ack) || ack < this.acked || ack > this.sent) {
      this.destroy(new TunnelError(TunnelErrorCode.overrun, `the other end acknowledged ${ack} bytes of ${this.sent} sent`));
      return;
    }
    this.acked = ack;
    this.pump();
    if (msg.data.length > 0) {
      // Not yet acknowledged by this end: at most what the other end counts as unacknowledged
      // (acknowledgements may still be on their way), a window, which a sender may pass by a
      // message. (Counting what waits unread instead took bytes acknowledged while a slow reader
      // left them unread for an overrun.)
      if (this.endHeard || this.received + msg.data.length - this.ackSaid > this.opts.windowBytes + 2 * this.opts.chunkBytes) {
        this.destroy(new TunnelError(TunnelErrorCode.overrun, "the other end sent past its window, or after its end"));
        return;
      }
      this.received += msg.data.length;
      // Taken at once while the reader wants more; else once it does (`_read`).
      if (this.push(msg.data)) this.taken = this.received;
      this.opts.onTraffic?.();
    }
    const controls = this.opts.controls?.filter((name) => h?.has(name));
    if (controls?.length) this.emit("control", Object.fromEntries(controls.map((name) => [name, h?.get(name) ?? ""])));
    if (h?.has(TunnelHeader.end) && !this.endHeard) {
      this.endHeard = true;
      this.push(null);
    }
    this.acknowledge();
  }
}

function oneLine(text: string): string {
  return text.replace(/[\r\n]+/g, " ").slice(0, 300);
}
