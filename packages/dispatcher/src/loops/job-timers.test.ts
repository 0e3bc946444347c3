import { deferred, silentLogger } from "@boxcar/common";
import { afterEach, beforeEach, describe, expect, test, vi } from "vitest";
import { JobTimers } from "./job-timers.js";

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("JobTimers", () => {
  test("acts on each job once its time has come, on the sweep's tick; a cleared job is not acted on", async () => {
    const acted: string[] = [];
    const timers = new JobTimers(100, async (id) => void acted.push(id), silentLogger, "act");
    const now = Date.now();
    timers.set("a", now + 150);
    timers.set("b", now + 450);
    timers.set("c", now + 50);
    expect(timers.clear("c")).toBe(true);
    timers.start();
    await vi.advanceTimersByTimeAsync(200);
    expect(acted).toEqual(["a"]);
    timers.set("b", undefined);
    await vi.advanceTimersByTimeAsync(500);
    expect(acted).toEqual(["a"]);
    timers.set("d", Date.now());
    await timers.run(); // now, not on the tick
    expect(acted).toEqual(["a", "d"]);
    await timers.stop();
  });

  test("once stopped, a pass under way acts on no more jobs", async () => {
    const release = deferred();
    const acted: string[] = [];
    const timers = new JobTimers(
      100,
      async (id) => {
        acted.push(id);
        await release.promise;
      },
      silentLogger,
      "act",
    );
    timers.set("a", Date.now());
    timers.set("b", Date.now());
    const pass = timers.run();
    const stopping = timers.stop();
    release.resolve();
    await Promise.all([pass, stopping]);
    expect(acted).toEqual(["a"]);
  });
});
