import type { Topology } from "@boxcar/fabric";
import { SystemPolicy } from "@boxcar/protocol";
import { expect, test } from "vitest";
import { defaultHeadroom, StoreRoom } from "./store-room.js";

const MiB = 1024 ** 2;

/** A topology whose JetStream account holds `account.storage` bytes under a limit of `account.limit` (-1: none). */
function accountOf(account: { storage: number; limit: number }): { topology: Topology; asked: () => number } {
  let asked = 0;
  const jsm = {
    getAccountInfo: async () => {
      asked += 1;
      return { storage: account.storage, limits: { max_storage: account.limit } };
    },
  };
  return { topology: { jsm } as unknown as Topology, asked: () => asked };
}

test("the headroom refuses new work only once the store's size is known: from the account's limit, or from JetStream's refusal", async () => {
  const policy = SystemPolicy.parse({ queue: { headroom: "2Mi" } });
  const account = { storage: 63 * MiB, limit: -1 };
  const { topology, asked } = accountOf(account);
  const room = new StoreRoom(topology);
  await room.prepare(policy);
  room.check(policy); // a server's max_file_store is not told: nothing is known, nothing refused

  // JetStream refuses a write: what the account holds then is the store's size.
  account.storage = 64 * MiB;
  await room.noteFull();
  expect(room.capacity).toBe(64 * MiB);
  expect(() => room.check(policy)).toThrow(
    expect.objectContaining({
      code: "storage_full",
      message: expect.stringContaining("holds 64 MiB of 64 MiB, and the last 2 MiB are kept"),
    }),
  );

  // Room freed is seen at the next job: while short, the figures are asked again each time.
  account.storage = 61 * MiB;
  const before = asked();
  await room.prepare(policy);
  expect(asked()).toBe(before + 1);
  room.check(policy);
  room.wrote(1.5 * MiB); // what this dispatcher stored since counts until the next answer
  expect(() => room.check(policy)).toThrow(expect.objectContaining({ code: "storage_full" }));
  expect(() => room.check(SystemPolicy.parse({ queue: { headroom: 0 } }))).not.toThrow();

  // Clearly more stored than the size learned: the store was given more, and is learned again.
  account.storage = 80 * MiB;
  await room.prepare(policy);
  expect(room.capacity).toBeUndefined();

  // An account's own limit is its size; the default headroom is 5% of it, 1 MiB to 1 GiB.
  const limited = new StoreRoom(accountOf({ storage: 96 * MiB, limit: 100 * MiB }).topology);
  await limited.prepare(SystemPolicy.parse({}));
  expect(limited.capacity).toBe(100 * MiB);
  expect(() => limited.check(SystemPolicy.parse({}))).toThrow(/the last 5 MiB are kept/); // 4 MiB free
  expect([defaultHeadroom(10 * MiB), defaultHeadroom(100 * MiB), defaultHeadroom(1024 ** 4)]).toEqual([MiB, 5 * MiB, 1024 * MiB]);
});
