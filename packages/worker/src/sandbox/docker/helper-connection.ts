/**
 * A connection a Docker session's helper opened to a port of its container's loopback
 * (docs/sessions.md#ports), as a `Duplex` on the worker: its bytes go as the helper's frames
 * over the container's attached stdin and stdout (`send`, `data`, `ack`, `hangup`;
 * helper/session-helper.cjs says them), each way at most `HELPER_WINDOW` bytes unacknowledged,
 * so one slow connection holds back only itself, not the helper's other frames.
 *
 * What the helper says is the session's own word: a helper that sends past its window ends the
 * connection, not the worker's memory.
 */

import { Duplex } from "node:stream";

/** The most bytes either side sends the other without an acknowledgement (the helper's `TUNNEL_WINDOW`). */
export const HELPER_WINDOW = 256 * 1024;
/** The most bytes in one frame: a line of base64 well within the helper's 1 MiB. */
const HELPER_CHUNK = 48 * 1024;
/**
 * How far past its window the helper may go: one read of its socket (64 KiB on Linux), which it
 * relays whole before it pauses the socket; doubled for slack. Counting what waited unread
 * instead (as before) took bytes already acknowledged for an overrun when the reader was slow.
 */
const HELPER_READ_OVERSHOOT = 128 * 1024;

/** A frame of the helper's about a connection (untrusted: every field checked here). */
export interface ConnectionFrame {
  t?: unknown;
  d?: unknown;
  n?: unknown;
  end?: unknown;
  error?: unknown;
}

export class HelperConnection extends Duplex {
  /** Bytes sent to the helper that it has not said it wrote. */
  private unacked = 0;
  private blocked: (() => void) | undefined;
  /** Bytes from the helper; how many of them are taken (the reader wants more), and were acknowledged. */
  private received = 0;
  private taken = 0;
  private ackSaid = 0;
  private endHeard = false;
  private hungUp = false;

  constructor(
    private readonly id: string,
    private readonly send: (frame: Record<string, unknown>) => void,
    private readonly gone: () => void,
  ) {
    // Little waits unread before the reader is asked again: a window and two frames at most.
    super({ allowHalfOpen: true, readableHighWaterMark: HELPER_CHUNK, writableHighWaterMark: HELPER_CHUNK });
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    for (let at = 0; at < chunk.length; at += HELPER_CHUNK) {
      const part = chunk.subarray(at, at + HELPER_CHUNK);
      this.unacked += part.length;
      this.send({ t: "send", id: this.id, d: part.toString("base64") });
    }
    if (this.unacked >= HELPER_WINDOW) this.blocked = () => callback();
    else callback();
  }

  override _final(callback: (error?: Error | null) => void): void {
    this.send({ t: "send", id: this.id, end: true });
    callback();
  }

  override _read(): void {
    // The reader wants more: all that came is taken (what waits unread is under a frame's worth).
    this.taken = this.received;
    this.acknowledge();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    this.blocked = undefined;
    this.gone();
    if (!this.hungUp) this.send({ t: "hangup", id: this.id });
    callback(error);
  }

  /** A frame of the helper's for this connection. */
  hear(frame: ConnectionFrame): void {
    if (this.destroyed) return;
    if (frame.t === "ack") {
      const n = Number(frame.n);
      if (!Number.isSafeInteger(n) || n < 0) return;
      this.unacked = Math.max(0, this.unacked - n);
      if (this.blocked && this.unacked < HELPER_WINDOW) {
        const go = this.blocked;
        this.blocked = undefined;
        go();
      }
    } else if (frame.t === "data") {
      if (typeof frame.d === "string" && frame.d !== "") {
        const data = Buffer.from(frame.d, "base64");
        // What it sent that this side has not acknowledged is at most what the helper counts as
        // unacknowledged (acknowledgements may still be on their way to it): its window, and the
        // one read of its socket it relays whole before it pauses.
        if (this.endHeard || this.received + data.length - this.ackSaid > HELPER_WINDOW + HELPER_READ_OVERSHOOT) {
          this.destroy(new Error("the session's helper sent past its window"));
          return;
        }
        this.received += data.length;
        // Taken at once while the reader wants more; else once it does (`_read`).
        if (this.push(data)) this.taken = this.received;
      }
      if (frame.end === true && !this.endHeard) {
        this.endHeard = true;
        this.push(null);
      }
      this.acknowledge();
    } else if (frame.t === "hangup") {
      this.hungUp = true;
      if (typeof frame.error === "string") this.destroy(new Error(`the connection in the session failed: ${frame.error.slice(0, 300)}`));
      else if (!this.endHeard) this.destroy(new Error("the connection in the session closed"));
      // It ended its way, and closed: what it sent is read first, and then nothing more can be written.
      else if (this.readableEnded) this.destroy();
      else this.once("end", () => this.destroy());
    }
  }

  /** Tells the helper what was taken of its bytes. */
  private acknowledge(): void {
    const owed = this.taken - this.ackSaid;
    if (owed <= 0 || this.hungUp) return;
    this.ackSaid += owed;
    this.send({ t: "ack", id: this.id, n: owed });
  }
}
