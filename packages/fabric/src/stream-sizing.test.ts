import { expect, test } from "vitest";
import { limitsFlag, shrinkTarget, sizesThatFit, wouldFit } from "./stream-sizing.js";
import { DEFAULT_STREAM_LIMITS } from "./topology-options.js";

const MiB = 1024 ** 2;

test("the sizes a refusal advises would be accepted, and leave half of what is free for jobs", () => {
  // A new system on a 64 MiB store: every stream missing.
  const advice = sizesThatFit(DEFAULT_STREAM_LIMITS, 64 * MiB, {});
  expect(advice && limitsFlag(advice)).toBe("events=17Mi,logs=8Mi,dead=4Mi,submit=1Mi");
  expect(advice && wouldFit(advice, 64 * MiB, {})).toBe(true);
  expect(Object.values(advice ?? {}).reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(32 * MiB);

  // A leftover intake that reserves the whole store: the advice shrinks it (it holds nothing).
  const leftover = { submit: { maxBytes: 64 * MiB, bytes: 0 } };
  const past = sizesThatFit(DEFAULT_STREAM_LIMITS, 0, leftover);
  expect(past && limitsFlag(past)).toBe("events=17Mi,logs=8Mi,dead=4Mi,submit=1Mi");
  expect(past && wouldFit(past, 0, leftover)).toBe(true);
  // What the user tried then now fits: the leftover is shrunk to the 4 MiB given.
  expect(wouldFit({ events: 16 * MiB, logs: 8 * MiB, dead: 4 * MiB, submit: 4 * MiB }, 0, leftover)).toBe(true);

  // Streams that exist and fit keep their sizes; only the missing ones are scaled.
  const some = { logs: { maxBytes: 4 * MiB, bytes: MiB }, dead: { maxBytes: 2 * MiB, bytes: 0 }, submit: { maxBytes: 2 * MiB, bytes: 0 } };
  const events = sizesThatFit({ ...DEFAULT_STREAM_LIMITS, events: 100 * MiB }, 56 * MiB, some);
  expect(events && limitsFlag(events)).toBe("events=28Mi,logs=4Mi,dead=2Mi,submit=2Mi");

  // Not even 1 MiB each: no advice.
  expect(sizesThatFit(DEFAULT_STREAM_LIMITS, 6 * MiB, {})).toBeUndefined();
});

test("a stream that exists is shrunk to the size given, never below what it holds", () => {
  expect(shrinkTarget({ maxBytes: 64 * MiB, bytes: 0 }, 4 * MiB)).toBe(4 * MiB);
  expect(shrinkTarget({ maxBytes: 64 * MiB, bytes: 10 * MiB + 1 }, 4 * MiB)).toBe(11 * MiB);
  expect(shrinkTarget({ maxBytes: 64 * MiB, bytes: 64 * MiB }, 4 * MiB)).toBeUndefined();
  expect(shrinkTarget({ maxBytes: 4 * MiB, bytes: 0 }, 8 * MiB)).toBeUndefined(); // never grown
  expect(shrinkTarget({ maxBytes: 0, bytes: 0 }, 8 * MiB)).toBeUndefined(); // an unlimited one is left alone
});
