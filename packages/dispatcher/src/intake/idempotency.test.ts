import { createHash } from "node:crypto";
import type { Topology } from "@boxcar/fabric";
import { type NatsTestServer, natsTestServer } from "@boxcar/fabric/testing";
import type { KV } from "@nats-io/kv";
import { errors as natsErrors } from "@nats-io/transport-node";
import { afterAll, beforeAll, beforeEach, expect, test } from "vitest";
import { claimKey } from "./idempotency.js";

// Against a real nats-server; the faults (a create that times out, a read that a rival's claim
// overtakes) are injected around the real bucket.
let nats: NatsTestServer;
let topology: Topology;

beforeAll(async () => {
  nats = await natsTestServer();
});
afterAll(async () => {
  await nats?.close();
});
beforeEach(async () => {
  topology = await nats.topology();
});

/** The job id the key holds; null when absent or deleted. */
async function stored(key: string): Promise<string | null> {
  const entry = await topology.idempotency.get(createHash("sha256").update(key).digest("hex"));
  return entry?.operation === "PUT" ? entry.string() : null;
}

/** The bucket, but its first `create` fails with a timeout (storing, or not), and `afterFirstGet` runs before the first read returns. */
function faulty(kv: KV, opts: { stores: boolean; afterFirstGet?: () => Promise<unknown> }): KV {
  let creates = 0;
  let gets = 0;
  return new Proxy(kv, {
    get(target, prop, receiver) {
      if (prop === "create") {
        return async (key: string, value: string) => {
          if (creates++ > 0) return target.create(key, value);
          if (opts.stores) await target.create(key, value);
          throw new natsErrors.TimeoutError();
        };
      }
      if (prop === "get") {
        return async (key: string) => {
          const entry = await target.get(key);
          if (gets++ === 0) await opts.afterFirstGet?.();
          return entry;
        };
      }
      const member = Reflect.get(target, prop, receiver);
      return typeof member === "function" ? member.bind(target) : member;
    },
  });
}

test("two submissions of one key race over a delete marker while one's create times out: one job between them", async () => {
  const key = "owner:alice:order-7";
  await claimKey(topology.idempotency, key, "old-job");
  await topology.idempotency.delete(createHash("sha256").update(key).digest("hex"));
  expect(await stored(key)).toBeNull(); // a delete marker

  let rival: Promise<string> | undefined;
  // A's create times out without storing; while A reads the key (still the marker), B claims it.
  const a = await claimKey(
    faulty(topology.idempotency, { stores: false, afterFirstGet: () => (rival = claimKey(topology.idempotency, key, "job-b")) }),
    key,
    "job-a",
  );
  const b = await rival;
  expect(b).toBe("job-b");
  expect(a).toBe("job-b");
  expect(await stored(key)).toBe("job-b");
});

test("a create that timed out but was stored is recognised as the caller's own claim", async () => {
  const key = "owner:alice:order-8";
  expect(await claimKey(faulty(topology.idempotency, { stores: true }), key, "job-a")).toBe("job-a");
  expect(await claimKey(topology.idempotency, key, "job-b")).toBe("job-a");
});

test("many submissions of one key at once, fresh and over a delete marker: one owner", async () => {
  for (const key of ["owner:bob:fresh", "owner:bob:deleted"]) {
    if (key.endsWith("deleted")) {
      await claimKey(topology.idempotency, key, "gone");
      await topology.idempotency.delete(createHash("sha256").update(key).digest("hex"));
    }
    const owners = await Promise.all(Array.from({ length: 8 }, (_, i) => claimKey(topology.idempotency, key, `job-${i}`)));
    expect(new Set(owners).size).toBe(1);
    expect(await stored(key)).toBe(owners[0]);
  }
});

test("with NATS failing every time, the claim fails instead of guessing", async () => {
  const broken = new Proxy(topology.idempotency, {
    get(target, prop, receiver) {
      if (prop === "create") return async () => Promise.reject(new natsErrors.TimeoutError());
      const member = Reflect.get(target, prop, receiver);
      return typeof member === "function" ? member.bind(target) : member;
    },
  });
  await expect(claimKey(broken, "owner:carol:x", "job-c")).rejects.toBeInstanceOf(natsErrors.TimeoutError);
  expect(await stored("owner:carol:x")).toBeNull();
});
