import { silentLogger } from "@boxcar/common";
import { expect, test } from "vitest";
import { type Part, Parts } from "./parts.js";

function recording(log: string[], names: string[], fail: { start?: string; stop?: string } = {}): Part[] {
  return names.map((name) => ({
    name,
    start: async () => {
      if (fail.start === name) throw new Error(`${name} will not start`);
      log.push(`start ${name}`);
    },
    stop: async () => {
      log.push(`stop ${name}`);
      if (fail.stop === name) throw new Error(`${name} will not stop`);
    },
  }));
}

test("parts start in the order listed and stop in the reverse order, each even when one fails; twice is once", async () => {
  const log: string[] = [];
  const parts = new Parts(
    [
      ...recording(log, ["books", "sweeps"], { stop: "sweeps" }),
      { name: "no start", stop: () => void log.push("stop no start") },
      ...recording(log, ["api"]),
    ],
    silentLogger,
  );
  await parts.start();
  expect(log).toEqual(["start books", "start sweeps", "start api"]);
  log.length = 0;
  await Promise.all([parts.stop(), parts.stop()]);
  expect(log).toEqual(["stop api", "stop no start", "stop sweeps", "stop books"]);
});

test("a part that fails to start: those started before it are stopped, last first, and its failure thrown", async () => {
  const log: string[] = [];
  const parts = new Parts(recording(log, ["a", "b", "c", "d"], { start: "c" }), silentLogger);
  await expect(parts.start()).rejects.toThrow("c will not start");
  expect(log).toEqual(["start a", "start b", "stop b", "stop a"]);
});
