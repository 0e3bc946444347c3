import { describe, expect, test } from "vitest";
import { deliveryFacts } from "./work-delivery.js";

describe("deliveryFacts", () => {
  test("reads the delivery count, stream sequence and pending count of the older ack subject", () => {
    // Taken from a nats-server 2.10 delivery: stream T, consumer c, 3rd delivery of stream message 41, none behind it.
    expect(deliveryFacts("$JS.ACK.T.c.3.41.7.1795354912968212801.0")).toEqual({ deliveryCount: 3, seq: 41, pending: 0 });
  });

  test("reads the newer form, with domain, account hash and a trailing token", () => {
    expect(deliveryFacts("$JS.ACK._.ACCHASH.BOXCAR_WORK.pool-default.2.9.5.1795354912968212801.4.xyz")).toEqual({
      deliveryCount: 2,
      seq: 9,
      pending: 4,
    });
  });

  test.each(["", "_INBOX.abc", "$JS.ACK.T.c.x.41.7.1.0", "$JS.ACK.T.c.0.41.7.1.0", "$JS.NAK.T.c.1.41.7.1.0", "$JS.ACK.T.c.1.41"])(
    "refuses %j, saying what it got",
    (reply) => {
      expect(() => deliveryFacts(reply)).toThrow(`not a JetStream delivery: reply subject ${JSON.stringify(reply)}`);
    },
  );
});
