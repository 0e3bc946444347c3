import { describe, expect, test } from "vitest";
import { HELPER_WINDOW, HelperConnection } from "./helper-connection.js";

/** A connection whose frames to the helper are kept, and a helper's `data` frame of `bytes` bytes. */
function connection() {
  const sent: Record<string, unknown>[] = [];
  const conn = new HelperConnection(
    "7",
    (frame) => sent.push(frame),
    () => {},
  );
  const errors: Error[] = [];
  conn.on("error", (err) => errors.push(err));
  const data = (bytes: number) => conn.hear({ t: "data", d: Buffer.alloc(bytes, 1).toString("base64") });
  const acked = () => sent.filter((f) => f.t === "ack").reduce((sum, f) => sum + Number(f.n), 0);
  return { conn, sent, errors, data, acked };
}

describe("HelperConnection's window", () => {
  test("a slow reader: bytes acknowledged while they wait unread do not count against the helper's window", () => {
    const { conn, errors, data, acked } = connection();
    // Taken at once (the reader's buffer was empty) and acknowledged, then left unread.
    data(40 * 1024);
    expect(acked()).toBe(40 * 1024);
    // The helper may then send its whole window, and the one socket read (64 KiB) it relays before it pauses.
    for (let sent = 0; sent < HELPER_WINDOW + 64 * 1024; sent += 32 * 1024) data(32 * 1024);
    expect(errors).toEqual([]);
    expect(conn.destroyed).toBe(false);
  });

  test("a helper that sends well past its window ends the connection", async () => {
    const { conn, errors, data } = connection();
    for (let sent = 0; sent < 2 * HELPER_WINDOW; sent += 32 * 1024) data(32 * 1024);
    expect(conn.destroyed).toBe(true);
    await new Promise((r) => setImmediate(r)); // the error is emitted on the next tick
    expect(errors.map((e) => e.message)).toEqual(["the session's helper sent past its window"]);
  });
});
