import { setTimeout as sleep } from "node:timers/promises";
import { type NatsServer, openTopology, silentLogger, startNatsServer, type Topology } from "@boxcar/client";
import type { Priority } from "@boxcar/protocol";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { PoolPuller } from "./pool-puller.js";
import type { WorkDelivery } from "./work-delivery.js";

// Against a real nats-server: the puller speaks JetStream's pull protocol itself.
let server: NatsServer;
let nc: NatsConnection;
let topology: Topology;
let prefixes = 0;

beforeAll(async () => {
  server = await startNatsServer();
  nc = await connect({ servers: server.url });
});
afterAll(async () => {
  await nc?.close();
  await server?.stop();
});
beforeEach(async () => {
  topology = await openTopology(nc, { prefix: `pp${++prefixes}`, ackWaitMs: 30_000 });
  await topology.ensurePoolConsumer("p");
});

const publish = (priority: Priority, body: string) => topology.js.publish(topology.names.subjects.work("p", priority), body);

/** Everything one sweep takes, as `priority:body`, with the deliveries. */
async function sweep(puller: PoolPuller, max: number): Promise<{ got: string[]; deliveries: WorkDelivery[] }> {
  const got: string[] = [];
  const deliveries: WorkDelivery[] = [];
  await puller.take(max, (d, priority) => {
    got.push(`${priority}:${new TextDecoder().decode(d.data)}`);
    deliveries.push(d);
  });
  return { got, deliveries };
}

const puller = (recheckMs = 1_000) => new PoolPuller(topology, "p", { recheckMs, log: silentLogger });

describe("PoolPuller", () => {
  test("a sweep takes high before normal before low, each in queue order, and no more than asked", async () => {
    for (const [p, b] of [
      ["low", "l1"],
      ["normal", "n1"],
      ["high", "h1"],
      ["low", "l2"],
      ["high", "h2"],
    ] as const)
      await publish(p, b);
    const p = puller();
    expect((await sweep(p, 3)).got).toEqual(["high:h1", "high:h2", "normal:n1"]);
    expect((await sweep(p, 3)).got).toEqual(["low:l1", "low:l2"]);
    expect((await sweep(p, 3)).got).toEqual([]);
    p.close();
  });

  test("a consumer that cannot be pulled is passed over; the sweep fails only when every one fails", async () => {
    await topology.jsm.consumers.delete(topology.names.streams.work, topology.names.poolConsumer("p", "high"));
    await publish("normal", "n1");
    const p = puller();
    expect((await sweep(p, 2)).got).toEqual(["normal:n1"]);
    await topology.jsm.consumers.delete(topology.names.streams.work, topology.names.poolConsumer("p", "normal"));
    await topology.jsm.consumers.delete(topology.names.streams.work, topology.names.poolConsumer("p", "low"));
    await expect(sweep(p, 2)).rejects.toThrow(/pulling high work from .* failed: no such consumer/);
    p.close();
  });

  test("while bells keep ringing, a priority found empty is still asked again: an item back without a bell is found", async () => {
    const abort = new AbortController();
    const recheckMs = 200;
    const p = puller(recheckMs);
    // Another worker holds a high item; this one goes idle (bells on) and finds every priority empty.
    await publish("high", "h1");
    const other = puller();
    const [held] = (await sweep(other, 1)).deliveries;
    await p.waitForWork(abort.signal);
    expect((await sweep(p, 4)).got).toEqual([]);
    // The high item comes back with no publish and, handed on, no bell.
    held?.passOn(20);
    other.close();
    // Normal work rings the bells more often than the recheck, for 4 rechecks' time, and never fills
    // the 4 slots offered (which would drop the bells and start afresh); the high item must still come.
    const seen: string[] = [];
    for (let i = 0; i < 40 && !seen.includes("high:h1"); i++) {
      await publish("normal", `n${i}`);
      await p.waitForWork(abort.signal);
      seen.push(...(await sweep(p, 4)).got);
      await sleep(recheckMs / 10);
    }
    expect(seen).toContain("high:h1");
    p.close();
  });

  test("settling: a nak comes back with the delivery counted; the first settle wins", async () => {
    await publish("normal", "n1");
    const p = puller();
    const first = (await sweep(p, 1)).deliveries[0];
    expect(first?.deliveryCount).toBe(1);
    first?.nak();
    first?.ack(); // too late: the nak was first
    await nc.flush();
    const again = (await sweep(p, 1)).deliveries[0];
    expect(again).toMatchObject({ deliveryCount: 2, seq: first?.seq });
    again?.term("not wanted");
    again?.nak();
    await nc.flush();
    expect((await sweep(p, 1)).got).toEqual([]);
    p.close();
  });
});
