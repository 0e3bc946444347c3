import { z } from "zod";

/** What a model's name may be: letters, digits and `. _ : / @ + -`, up to 128 characters (`gpt-4o-mini`, `anthropic/claude-3.5-sonnet`, `llama3:8b`). */
export const MODEL_NAME = /^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$/;

/** One line of an agent's usage file (`$BOXCAR_USAGE_FILE`): what one call to its provider used. */
export const UsageLine = z.looseObject({
  model: z
    .string()
    .regex(MODEL_NAME)
    .optional()
    .catch(undefined)
    .describe("the model called; a name that is not a model's (see MODEL_NAME) is left out, and the call still counts"),
  tokensIn: z.number().int().min(0).max(1e12).default(0).describe("tokens sent (prompt)"),
  tokensOut: z.number().int().min(0).max(1e12).default(0).describe("tokens received (completion)"),
  cost: z.number().min(0).max(1e9).default(0).describe("what the call cost, in the currency the budgets are in"),
});
export type UsageLine = z.infer<typeof UsageLine>;

const Totals = {
  calls: z.number().int().nonnegative(),
  tokensIn: z.number().int().nonnegative(),
  tokensOut: z.number().int().nonnegative(),
  cost: z.number().nonnegative(),
};

/** Usage summed: of an attempt, a job, or an agent's or a user's day. */
export const Usage = z.strictObject({
  ...Totals,
  models: z.record(z.string(), z.strictObject(Totals)).optional().describe("the same, per model (at most 32; the rest under `other`)"),
});
export type Usage = z.infer<typeof Usage>;

/** The most models a usage keeps apart; calls to others are summed under `other`. */
const MAX_MODELS = 32;

export const NO_USAGE: Usage = { calls: 0, tokensIn: 0, tokensOut: 0, cost: 0 };

/** `a` and `b` summed (models kept apart up to 32). */
export function addUsage(a: Usage, b: Usage): Usage {
  // Counts stop at the largest safe integer (and cost at 1e15): a report that big is nonsense, and
  // past it a record would no longer parse.
  const add = (x: number, y: number) => Math.min(x + y, Number.MAX_SAFE_INTEGER);
  const sum = (x: Omit<Usage, "models">, y: Omit<Usage, "models">) => ({
    calls: add(x.calls, y.calls),
    tokensIn: add(x.tokensIn, y.tokensIn),
    tokensOut: add(x.tokensOut, y.tokensOut),
    cost: Math.min(x.cost + y.cost, 1e15),
  });
  const models: NonNullable<Usage["models"]> = { ...a.models };
  for (const [model, used] of Object.entries(b.models ?? {})) {
    const name = models[model] !== undefined || Object.keys(models).length < MAX_MODELS ? model : "other";
    models[name] = sum(models[name] ?? NO_USAGE, used);
  }
  return { ...sum(a, b), ...(Object.keys(models).length > 0 ? { models } : {}) };
}

/** The usage of the calls an agent reported, one line each. */
export function usageOf(lines: readonly UsageLine[]): Usage {
  let total: Usage = NO_USAGE;
  for (const line of lines) {
    const call = { calls: 1, tokensIn: line.tokensIn, tokensOut: line.tokensOut, cost: line.cost };
    total = addUsage(total, line.model === undefined ? call : { ...call, models: { [line.model]: call } });
  }
  return total;
}

/** A budget: the most an agent or a user may use in a day (UTC), and what happens past it. */
export const Budget = z.strictObject({
  cost: z.number().positive().optional().describe("the most it may cost in a day"),
  tokens: z.number().int().positive().optional().describe("the most tokens, in and out, in a day"),
  onExceeded: z
    .enum(["refuse", "stop"])
    .default("refuse")
    .describe("once spent: `refuse` new jobs (`budget_exceeded`), or also `stop` (cancel) the running ones"),
});
export type Budget = z.infer<typeof Budget>;

/** Whether `used` has reached `budget`. */
export function spent(budget: Budget, used: Usage): boolean {
  return (
    (budget.cost !== undefined && used.cost >= budget.cost) ||
    (budget.tokens !== undefined && used.tokensIn + used.tokensOut >= budget.tokens)
  );
}

/** The usage bucket's key of a day's usage of one agent or user. */
export const usageKey = (day: string, kind: "agent" | "user", name: string): string => `${day}.${kind}.${name}`;

/** An entry of the usage bucket: the usage summed, and the stream sequence of the last usage event summed into it. */
export function parseUsageEntry(text: string): { usage: Usage; seq: number } | undefined {
  try {
    const { seq, ...rest } = JSON.parse(text) as Record<string, unknown>;
    const usage = Usage.safeParse(rest);
    return usage.success && typeof seq === "number" ? { usage: usage.data, seq } : undefined;
  } catch {
    return undefined;
  }
}

/** The day (UTC, `YYYY-MM-DD`) a time falls on: usage is summed per day. */
export const usageDay = (at: Date | string | number): string => new Date(at).toISOString().slice(0, 10);

export const UsageDay = z.string().regex(/^\d{4}-\d{2}-\d{2}$/, "a day as YYYY-MM-DD");

export const UsageRequest = z.strictObject({
  day: UsageDay.optional().describe("the day (UTC); default today"),
});
export const UsageReply = z.strictObject({
  day: UsageDay,
  agents: z.record(z.string(), Usage).describe("each agent's usage that day (to a viewer or an admin; a submitter gets none)"),
  users: z.record(z.string(), Usage).describe("each user's usage that day (a submitter: its own)"),
});
export type UsageReply = z.infer<typeof UsageReply>;
