import { afterEach, beforeEach, describe, expect, test, vi } from "vitest";
import { KeyTimers, MAX_TIMER_MS } from "./key-timers.js";

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("KeyTimers", () => {
  test("a key's timer replaces the one before; stop clears every timer and sets none after", async () => {
    const fired: string[] = [];
    const timers = new KeyTimers();
    timers.set("a", 100, () => fired.push("a1"));
    timers.set("a", 300, () => fired.push("a2"));
    timers.set("b", -5, () => fired.push("b"));
    expect(timers.has("a")).toBe(true);
    await vi.advanceTimersByTimeAsync(200);
    expect(fired).toEqual(["b"]);
    await vi.advanceTimersByTimeAsync(200);
    expect(fired).toEqual(["b", "a2"]);
    expect(timers.has("a")).toBe(false);
    timers.set("c", 100, () => fired.push("c"));
    timers.clear("c");
    timers.set("d", 100, () => fired.push("d"));
    timers.stop();
    timers.set("e", 100, () => fired.push("e"));
    await vi.advanceTimersByTimeAsync(500);
    expect(fired).toEqual(["b", "a2"]);
  });

  test("a time past setTimeout's limit is reached a day at a time", async () => {
    const fired: number[] = [];
    const timers = new KeyTimers();
    timers.set("far", 3 * MAX_TIMER_MS + 10, () => fired.push(Date.now()));
    const start = Date.now();
    await vi.advanceTimersByTimeAsync(3 * MAX_TIMER_MS);
    expect(fired).toEqual([]);
    expect(timers.has("far")).toBe(true);
    await vi.advanceTimersByTimeAsync(10);
    expect(fired).toEqual([start + 3 * MAX_TIMER_MS + 10]);
  });
});
