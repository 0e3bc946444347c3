/**
 * The tunnel protocol (common's TunnelStream, docs/nats-api.md#ports) between two ends on a real
 * nats-server: bytes through exactly with a reader that stops now and then, whose unread bytes
 * stay bounded; each way's end on its own; a reset said with its reason; and a lost message, a
 * peer that sends past its window and one that falls silent each end the tunnel.
 */

import { createHash, randomBytes } from "node:crypto";
import { TunnelStream, type TunnelStreamOptions } from "@boxcar/common";
import { startNatsServer } from "@boxcar/fabric";
import { connect, headers, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, test } from "vitest";

const WINDOW = 256 * 1024;
const CHUNK = 16 * 1024;

describe("a tunnel's two ends over NATS", () => {
  let server: Awaited<ReturnType<typeof startNatsServer>>;
  let a: NatsConnection;
  let b: NatsConnection;
  let n = 0;

  beforeAll(async () => {
    server = await startNatsServer();
    a = await connect({ servers: server.url });
    b = await connect({ servers: server.url });
  });
  afterAll(async () => {
    await a?.close();
    await b?.close();
    await server?.stop();
  });

  /** Two opened ends on fresh subjects (`options` for the second). */
  const pair = (options: Partial<TunnelStreamOptions> = {}) => {
    n += 1;
    const there = `t.${n}.there`;
    const back = `t.${n}.back`;
    const base = { windowBytes: WINDOW, chunkBytes: CHUNK };
    const near = new TunnelStream(a, { ...base, send: there, receive: back });
    const far = new TunnelStream(b, { ...base, ...options, send: back, receive: there });
    // What the near end hears of a far end's failure is not what these tests look at.
    near.on("error", () => {});
    return { near, far, there, back };
  };

  const errorOf = (stream: TunnelStream) =>
    new Promise<Error & { code?: string }>((resolve) => stream.once("error", (err) => resolve(err)));

  test("20 MiB through, exactly, to a reader that stops now and then: what waits unread stays within a window and two messages", async () => {
    const { near, far } = pair();
    await b.flush();
    near.open();
    far.open();
    const data = randomBytes(20 * 1024 * 1024);
    near.end(data);
    const got: Buffer[] = [];
    let most = 0;
    for await (const chunk of far) {
      got.push(chunk as Buffer);
      if (got.length % 64 === 0) {
        await new Promise((r) => setTimeout(r, 30));
        most = Math.max(most, far.readableLength);
      }
    }
    const whole = Buffer.concat(got);
    expect(whole.length).toBe(data.length);
    expect(createHash("sha256").update(whole).digest("hex")).toBe(createHash("sha256").update(data).digest("hex"));
    expect(most).toBeGreaterThan(0); // the reader did fall behind
    expect(most).toBeLessThanOrEqual(WINDOW + 2 * CHUNK);
  });

  test("each way ends on its own (a half-close), and both close cleanly", async () => {
    const { near, far } = pair();
    await b.flush();
    near.open();
    far.open();
    near.end("question");
    const asked: Buffer[] = [];
    far.on("data", (c: Buffer) => asked.push(c));
    await new Promise((r) => far.once("end", r));
    expect(Buffer.concat(asked).toString()).toBe("question");
    // The far end still writes after the near one's end.
    far.end("answer");
    const answered: Buffer[] = [];
    for await (const chunk of near) answered.push(chunk as Buffer);
    expect(Buffer.concat(answered).toString()).toBe("answer");
    await new Promise((r) => (far.closed ? r(undefined) : far.once("close", r)));
    expect(near.errored).toBeNull();
    expect(far.errored).toBeNull();
  });

  test("a reset reaches the other end with its reason", async () => {
    const { near, far } = pair();
    await b.flush();
    near.open();
    far.open();
    const failed = errorOf(far);
    near.destroy(new Error("the server dropped it"));
    expect(await failed).toMatchObject({ code: "tunnel_reset", message: expect.stringMatching(/the server dropped it/) });
  });

  test("a lost message, data past the window, and silence each end the tunnel", async () => {
    // A message numbered out of turn: one was lost.
    const lost = pair();
    await b.flush();
    lost.far.open();
    const lostError = errorOf(lost.far);
    const h = headers();
    h.set("Boxcar-Seq", "7");
    h.set("Boxcar-Ack", "0");
    a.publish(lost.there, new Uint8Array(1), { headers: h });
    expect(await lostError).toMatchObject({ code: "tunnel_lost" });

    // A peer that sends three windows without waiting for an acknowledgement, to a reader that reads nothing.
    const flood = pair();
    await b.flush();
    flood.far.open();
    flood.far.pause();
    const floodError = errorOf(flood.far);
    for (let seq = 1; seq <= (3 * WINDOW) / CHUNK; seq++) {
      const hh = headers();
      hh.set("Boxcar-Seq", String(seq));
      hh.set("Boxcar-Ack", "0");
      a.publish(flood.there, new Uint8Array(CHUNK), { headers: hh });
    }
    expect(await floodError).toMatchObject({ code: "tunnel_overrun" });

    // A peer that never says anything.
    const quiet = pair({ heartbeatMs: 100, silenceMs: 400 });
    await b.flush();
    quiet.far.open();
    expect(await errorOf(quiet.far)).toMatchObject({ code: "tunnel_silent" });
    for (const stream of [lost.near, flood.near, quiet.near]) stream.destroy();
  });
});
