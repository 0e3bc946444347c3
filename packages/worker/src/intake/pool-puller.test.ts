import { rm } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { silentLogger } from "@boxcar/common";
import { type NatsServer, openTopology, startNatsServer, type Topology } from "@boxcar/fabric";
import { type NatsTestServer, natsTestServer } from "@boxcar/fabric/testing";
import { PRIORITIES, type Priority } from "@boxcar/protocol";
import { connect, headers } from "@nats-io/transport-node";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { type IdleWait, PoolPuller } from "./pool-puller.js";
import type { WorkDelivery } from "./work-delivery.js";

// Against a real nats-server: the puller speaks JetStream's pull protocol itself.
let nats: NatsTestServer;
let topology: Topology;

beforeAll(async () => {
  nats = await natsTestServer();
});
afterAll(async () => {
  await nats?.close();
});
beforeEach(async () => {
  topology = await nats.topology({ ackWaitMs: 30_000 });
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

const puller = () => PoolPuller.ofPool(topology, "p", { log: silentLogger });

async function until(done: () => boolean, ms = 2_000): Promise<void> {
  for (let i = 0; i < ms / 10 && !done(); i++) await sleep(10);
  if (!done()) throw new Error("timed out waiting");
}

/** A worker's side of an idle wait, with `slots` free slots, recording what it was offered. */
function idleWaiter(opts: { slots?: number } = {}) {
  const abort = new AbortController();
  let free = opts.slots ?? 10;
  let ended = false;
  const fullListeners = new Set<() => void>();
  const got: string[] = [];
  const refused: string[] = [];
  const deliveries: WorkDelivery[] = [];
  const wait: IdleWait = {
    signal: abort.signal,
    offer: (d, priority) => {
      const what = `${priority}:${new TextDecoder().decode(d.data)}`;
      if (free === 0) {
        refused.push(what);
        return false;
      }
      free -= 1;
      got.push(what);
      deliveries.push(d);
      d.ack();
      return true;
    },
    onFull: (full) => {
      fullListeners.add(full);
      return () => {
        ended = true;
        fullListeners.delete(full);
      };
    },
  };
  return {
    wait,
    got,
    refused,
    deliveries,
    ended: () => ended,
    stop: () => abort.abort(),
    fill: () => {
      free = 0;
      for (const full of fullListeners) full();
    },
  };
}

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
  });

  test("a consumer that cannot be pulled is passed over; the sweep fails only when every one fails", async () => {
    await topology.jsm.consumers.delete(topology.names.streams.work, topology.names.poolConsumer("p", "high"));
    await publish("normal", "n1");
    const p = puller();
    expect((await sweep(p, 2)).got).toEqual(["normal:n1"]);
    await topology.jsm.consumers.delete(topology.names.streams.work, topology.names.poolConsumer("p", "normal"));
    await topology.jsm.consumers.delete(topology.names.streams.work, topology.names.poolConsumer("p", "low"));
    await expect(sweep(p, 2)).rejects.toThrow(/pulling high work from .* failed: no such consumer/);
  });

  test("an idle wait is handed new work of any priority as it is published, and waits on while nothing queues behind it", async () => {
    const p = puller();
    const waiter = idleWaiter();
    const waiting = p.waitForWork(waiter.wait);
    await nats.nc.flush();
    await publish("low", "l1");
    await until(() => waiter.got.length === 1);
    await publish("high", "h1");
    await until(() => waiter.got.length === 2);
    expect(waiter.got).toEqual(["low:l1", "high:h1"]);
    expect(waiter.ended()).toBe(false);
    waiter.stop();
    await waiting;
    expect((await sweep(p, 5)).got).toEqual([]);
  });

  test("an idle wait ends once work queues up, leaving what waits to a sweep in priority order", async () => {
    const p = puller();
    // Queued behind one another: the first item reaches the waiting pull with more behind it.
    for (const [priority, body] of [
      ["low", "l1"],
      ["low", "l2"],
      ["normal", "n1"],
      ["high", "h1"],
    ] as const)
      await publish(priority, body);
    const waiter = idleWaiter();
    await p.waitForWork(waiter.wait);
    expect(waiter.got.length).toBeGreaterThanOrEqual(1);
    const rest = (await sweep(p, 5)).got;
    expect([...waiter.got, ...rest].sort()).toEqual(["high:h1", "low:l1", "low:l2", "normal:n1"]);
    // The sweep takes what is left in priority order.
    const order = ["high", "normal", "low"];
    const ranks = rest.map((g) => order.indexOf(g.split(":")[0] as string));
    expect(ranks).toEqual([...ranks].sort());
    expect(rest).toContain("low:l2");
  });

  test("an item handed back with a delay comes to an idle worker when it is due, with no sweep", async () => {
    await publish("normal", "n1");
    const [held] = (await sweep(puller(), 1)).deliveries;
    const p = puller();
    const waiter = idleWaiter();
    const waiting = p.waitForWork(waiter.wait);
    await nats.nc.flush();
    held?.nak(50);
    await until(() => waiter.got.length === 1);
    expect(waiter.got).toEqual(["normal:n1"]);
    expect(waiter.deliveries[0]?.deliveryCount).toBe(2);
    waiter.stop();
    await waiting;
  });

  test("an item with no free slot goes back at once and ends the wait; full slots end it and withdraw its pulls", async () => {
    const p = puller();
    const noSlot = idleWaiter({ slots: 0 });
    const waiting = p.waitForWork(noSlot.wait);
    await nats.nc.flush();
    await publish("normal", "n1");
    await waiting;
    expect(noSlot.refused).toEqual(["normal:n1"]);
    const back = (await sweep(p, 1)).deliveries;
    expect(back.map((d) => d.deliveryCount)).toEqual([2]);
    back[0]?.ack();

    const full = idleWaiter();
    const waiting2 = p.waitForWork(full.wait);
    await nats.nc.flush();
    full.fill();
    await waiting2;
    // The withdrawn pulls take nothing: a new item waits for a sweep, delivered for the first time.
    await publish("high", "h1");
    await nats.nc.flush();
    await sleep(100);
    expect(full.got).toEqual([]);
    expect((await sweep(p, 1)).deliveries.map((d) => d.deliveryCount)).toEqual([1]);
  });

  test("after its server restarts, an idle wait ends at once, and the next one is handed work: its pulls went with the server", async () => {
    // A server of its own, killed and started again on the same port and store; pulls that would wait a minute.
    const own = await startNatsServer();
    const ownNc = await connect({ servers: own.url, reconnectTimeWait: 100, maxReconnectAttempts: -1 });
    let again: NatsServer | undefined;
    try {
      const ownTopology = await openTopology(ownNc, { prefix: "restart" });
      await ownTopology.ensurePoolConsumer("p");
      const p = PoolPuller.ofPool(ownTopology, "p", { log: silentLogger, idlePullMs: 60_000, idleHeartbeatMs: 20_000 });
      const waiter = idleWaiter();
      const waiting = p.waitForWork(waiter.wait);
      await ownNc.flush();
      const reconnected = (async () => {
        for await (const s of ownNc.status()) if (s.type === "reconnect") return;
      })();
      await own.kill();
      again = await startNatsServer({ port: own.port, storeDir: own.storeDir });
      await reconnected;
      await waiting;
      const next = p.waitForWork(waiter.wait);
      await ownNc.flush();
      await ownTopology.js.publish(ownTopology.names.subjects.work("p", "normal"), "after");
      await until(() => waiter.got.length > 0);
      expect(waiter.got).toEqual(["normal:after"]);
      waiter.stop();
      await next;
    } finally {
      await ownNc.close();
      await again?.stop();
      await rm(own.storeDir, { recursive: true, force: true });
    }
  });

  describe("with a stand-in for a pool's consumer leaders, which holds the waiting pulls it is sent", () => {
    /** Answers to the pulls of pool `ghost` (whose consumers do not exist): it keeps each pull's reply subject, by priority. */
    function standIn() {
      const pulls: { priority: Priority; reply: string; body: unknown }[] = [];
      const subs = PRIORITIES.map((priority) => {
        const next = `$JS.API.CONSUMER.MSG.NEXT.${topology.names.streams.work}.${topology.names.poolConsumer("ghost", priority)}`;
        return nats.nc.subscribe(next, {
          callback: (_err, msg) => {
            pulls.push({ priority, reply: msg.reply ?? "", body: msg.json() });
          },
        });
      });
      const status = (reply: string, code: number, description: string) =>
        nats.nc.publish(reply, undefined, { headers: headers(code, description) });
      return {
        pulls,
        status,
        stop: () => {
          for (const sub of subs) sub.unsubscribe();
        },
      };
    }

    test("a waiting pull is renewed neither while its leader's heartbeats come nor when they stop: then the wait ends, for a sweep and a fresh wait", async () => {
      const leaders = standIn();
      const p = PoolPuller.ofPool(topology, "ghost", { log: silentLogger, idleHeartbeatMs: 300 });
      let ended = false;
      const waiting = p.waitForWork(idleWaiter().wait).then(() => {
        ended = true;
      });
      await until(() => leaders.pulls.length === 3);
      expect(leaders.pulls.map((pull) => pull.body)).toEqual(
        PRIORITIES.map(() => ({ batch: 1, expires: 300_000_000_000, idle_heartbeat: 300_000_000 })),
      );
      // Heartbeats for several times the silence a pull is taken for lost after (a heartbeat and a quarter).
      let beats = 0;
      const beating = setInterval(() => {
        beats += 1;
        for (const pull of leaders.pulls) leaders.status(pull.reply, 100, "Idle Heartbeat");
      }, 100);
      try {
        await until(() => beats >= 40, 10_000);
        expect(ended).toBe(false);
        expect(leaders.pulls).toHaveLength(3);
        // One consumer's leader goes silent; the others beat on.
        leaders.pulls.splice(1, 1);
        await waiting;
        expect(leaders.pulls).toHaveLength(2);
      } finally {
        clearInterval(beating);
        leaders.stop();
      }
    }, 20_000);

    test("a pull its consumer's new leader ends (409 Leadership Change) is asked again at once, and nothing is logged as failing", async () => {
      const leaders = standIn();
      const warnings: string[] = [];
      const log = { ...silentLogger, warn: (_o: unknown, m: string) => warnings.push(m), child: () => log } as never;
      const p = PoolPuller.ofPool(topology, "ghost", { log });
      const waiter = idleWaiter();
      const waiting = p.waitForWork(waiter.wait);
      await until(() => leaders.pulls.length === 3);
      const high = leaders.pulls.find((pull) => pull.priority === "high");
      leaders.status(high?.reply ?? "", 409, "Leadership Change");
      await until(() => leaders.pulls.length === 4);
      expect(leaders.pulls[3]?.priority).toBe("high");
      expect(warnings).toEqual([]);
      waiter.stop();
      await waiting;
      leaders.stop();
    });
  });

  test("a priority whose consumer is gone is logged; the others go on waiting", async () => {
    await topology.jsm.consumers.delete(topology.names.streams.work, topology.names.poolConsumer("p", "high"));
    const warnings: string[] = [];
    const p = PoolPuller.ofPool(topology, "p", { log: { ...silentLogger, warn: (_o: unknown, m: string) => warnings.push(m) } as never });
    const waiter = idleWaiter();
    const waiting = p.waitForWork(waiter.wait);
    await until(() => warnings.length > 0);
    await publish("normal", "n1");
    await until(() => waiter.got.length === 1);
    expect(waiter.got).toEqual(["normal:n1"]);
    expect(warnings).toEqual(["waiting for work failed; asking again in a moment"]);
    waiter.stop();
    await waiting;
  });

  test("settling: a nak comes back with the delivery counted; the first settle wins", async () => {
    await publish("normal", "n1");
    const p = puller();
    const first = (await sweep(p, 1)).deliveries[0];
    expect(first?.deliveryCount).toBe(1);
    first?.nak();
    first?.ack(); // too late: the nak was first
    await nats.nc.flush();
    const again = (await sweep(p, 1)).deliveries[0];
    expect(again).toMatchObject({ deliveryCount: 2, seq: first?.seq });
    again?.term("not wanted");
    again?.nak();
    await nats.nc.flush();
    expect((await sweep(p, 1)).got).toEqual([]);
  });
});
