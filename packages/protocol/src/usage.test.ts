import { expect, test } from "vitest";
import { Usage, UsageLine, usageOf } from "./usage.js";

test("usage sums per model, up to 32 models apart, the rest under other", () => {
  const lines = Array.from({ length: 40 }, (_, i) => UsageLine.parse({ model: `m${i}`, tokensIn: 1, tokensOut: 2, cost: 0.5 }));
  const usage = usageOf(lines);
  expect(usage).toMatchObject({ calls: 40, tokensIn: 40, tokensOut: 80, cost: 20 });
  expect(Object.keys(usage.models ?? {})).toHaveLength(33);
  expect(usage.models?.other).toEqual({ calls: 8, tokensIn: 8, tokensOut: 16, cost: 4 });
});

test("attack: an agent that reports more than can be counted leaves a usage that still parses, its totals stopped at the largest safe integer", () => {
  // 10 000 lines of the most a line may say: summed plainly, past 2^53, which no record would parse.
  const lines = Array.from({ length: 10_000 }, () => UsageLine.parse({ tokensIn: 1e12, tokensOut: 1e12, cost: 1e9 }));
  const usage = usageOf(lines);
  expect(usage.tokensIn).toBe(Number.MAX_SAFE_INTEGER);
  expect(usage.cost).toBe(1e13);
  expect(Usage.safeParse(usage).success).toBe(true);
});

test("attack: a model name that is not one (a secret's carrier, a sentence, a path of dots) is left out and its call still counts", () => {
  const lines = ["m-sk live key", "x".repeat(129), "../../etc", "", "gpt-4o-mini", "anthropic/claude-3.5-sonnet", "llama3:8b"].map(
    (model) => UsageLine.parse({ model, tokensIn: 1 }),
  );
  expect(lines.map((l) => l.model)).toEqual([
    undefined,
    undefined,
    undefined,
    undefined,
    "gpt-4o-mini",
    "anthropic/claude-3.5-sonnet",
    "llama3:8b",
  ]);
  const usage = usageOf(lines);
  expect(usage.calls).toBe(7);
  expect(Object.keys(usage.models ?? {})).toEqual(["gpt-4o-mini", "anthropic/claude-3.5-sonnet", "llama3:8b"]);
});
