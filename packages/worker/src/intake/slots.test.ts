import { expect, test } from "vitest";
import { Slots } from "./slots.js";

test("slots hand out at most the capacity, wait for a release, and give 0 once closed", async () => {
  const slots = new Slots(3);
  expect(await slots.acquire(2)).toBe(2);
  expect(await slots.acquire(5)).toBe(1);
  const waiting = slots.acquire(4);
  let got: number | undefined;
  void waiting.then((n) => {
    got = n;
  });
  await Promise.resolve();
  expect(got).toBeUndefined();
  slots.release(2);
  expect(await waiting).toBe(2);
  const blocked = slots.acquire(1);
  slots.close();
  expect(await blocked).toBe(0);
  expect(await slots.acquire(1)).toBe(0);
});

test("acquireWithin takes a slot that frees in time, and gives up when none does", async () => {
  const slots = new Slots(1);
  expect(slots.tryAcquire()).toBe(true);
  const waiting = slots.acquireWithin(1_000);
  setTimeout(() => slots.release(1), 50);
  expect(await waiting).toBe(true);
  expect(await slots.acquireWithin(50)).toBe(false);
  slots.close();
  expect(await slots.acquireWithin(1_000)).toBe(false);
});
