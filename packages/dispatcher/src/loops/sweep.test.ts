import { deferred } from "@boxcar/common";
import { afterEach, beforeEach, describe, expect, test, vi } from "vitest";
import { Sweep } from "./sweep.js";

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("Sweep", () => {
  test("nothing runs until it starts; then a pass every interval, failures told to onError", async () => {
    const errors: unknown[] = [];
    let passes = 0;
    const sweep = new Sweep({
      pass: async () => {
        passes += 1;
        if (passes === 2) throw new Error("boom");
      },
      intervalMs: 100,
      onError: (err) => errors.push(err),
    });
    await vi.advanceTimersByTimeAsync(500);
    expect(passes).toBe(0);
    sweep.start();
    sweep.start(); // once
    await vi.advanceTimersByTimeAsync(350);
    expect(passes).toBe(3);
    expect(errors).toEqual([new Error("boom")]);
    await sweep.stop();
    await vi.advanceTimersByTimeAsync(500);
    expect(passes).toBe(3);
  });

  test("run joins the pass under way; stop aborts its signal and waits for it", async () => {
    const release = deferred();
    let passes = 0;
    let aborted = false;
    const sweep = new Sweep({
      pass: async (signal) => {
        passes += 1;
        await release.promise;
        aborted = signal.aborted;
        return passes;
      },
      intervalMs: 100,
      onError: () => {},
    });
    const first = sweep.run();
    const second = sweep.run();
    expect(passes).toBe(1);
    let stopped = false;
    const stopping = sweep.stop().then(() => {
      stopped = true;
    });
    await vi.advanceTimersByTimeAsync(10);
    expect(stopped).toBe(false);
    release.resolve();
    await stopping;
    expect([await first, await second, aborted, sweep.stopped]).toEqual([1, 1, true, true]);
    sweep.start(); // not after stop
    await vi.advanceTimersByTimeAsync(500);
    expect(passes).toBe(1);
  });

  test("a caller of run gets the pass's failure; stop does not", async () => {
    const sweep = new Sweep({ pass: () => Promise.reject(new Error("no")), intervalMs: 100, onError: () => {} });
    const run = sweep.run();
    await expect(run).rejects.toThrow("no");
    await sweep.stop();
  });
});
