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
