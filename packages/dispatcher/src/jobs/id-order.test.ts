import { expect, test } from "vitest";
import { IdOrder } from "./id-order.js";

const id = (i: number) => `j${String(i).padStart(5, "0")}`;
const walk = (order: IdOrder, step: 1 | -1, after?: string) =>
  [
    ...order.walk(
      after,
      step,
      () => undefined,
      () => true,
    ),
  ].map(([i]) => i);

test("ids come in order both ways, from a cursor or not, wherever they wait (main, recent, past a merge)", () => {
  const order = new IdOrder();
  // A replay in store order, sorted at the first walk; then ids that go before the last.
  for (let i = 0; i < 6_000; i += 2) order.add(id(i), i);
  expect(walk(order, 1).slice(0, 3)).toEqual([id(0), id(2), id(4)]);
  for (let i = 5_999; i > 0; i -= 2) order.add(id(i), i); // 2 999 wait in recent (one more went after the last)
  const all = Array.from({ length: 6_000 }, (_, k) => id(k));
  expect(walk(order, 1)).toEqual(all);
  expect(walk(order, -1)).toEqual([...all].reverse());
  expect(walk(order, 1, id(2_999))).toEqual(all.slice(3_000));
  expect(walk(order, 1, `${id(2_999)}x`)).toEqual(all.slice(3_000)); // a cursor not among them
  expect(walk(order, -1, id(3_000))).toEqual(all.slice(0, 3_000).reverse());
  for (let i = 10_999; i >= 6_000; i--) order.add(id(i), i); // past RECENT_MAX: merged
  expect(walk(order, -1).length).toBe(11_000);
  expect(walk(order, 1, id(10_997))).toEqual([id(10_998), id(10_999)]);
  // No walk since: 5 000 more that go before the last are left for the next walk to sort.
  for (let i = 11_000; i < 16_000; i++) order.add(`${id(i)}`, i);
  for (let i = 0; i < 5_000; i++) order.add(`${id(i)}b`, 100_000 + i);
  const sorted = walk(order, 1);
  expect(sorted.length).toBe(21_000);
  expect(sorted).toEqual([...sorted].sort());
  expect(sorted.slice(0, 3)).toEqual([id(0), `${id(0)}b`, id(1)]);
});

test("a walk keeps the ids it began with; each slot is the one its id was added with", () => {
  const order = new IdOrder();
  for (let i = 0; i < 10; i++) order.add(id(i * 10), i);
  const walking = order.walk(
    undefined,
    -1,
    () => undefined,
    () => true,
  );
  expect(walking.next().value).toEqual([id(90), 9]);
  order.add(id(95), 95); // after the walk began: not in it
  order.add(id(45), 45);
  expect([...walking].map(([i]) => i)).toEqual([80, 70, 60, 50, 40, 30, 20, 10, 0].map(id));
  expect([
    ...order.walk(
      undefined,
      1,
      () => undefined,
      (slot) => slot === 45,
    ),
  ]).toEqual([[id(45), 45]]);
});
