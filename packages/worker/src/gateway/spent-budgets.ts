import type { Budget, SystemPolicy, Usage } from "@boxcar/protocol";
import { spent, usageDay } from "@boxcar/protocol/internal";

/** A day's usage of one agent or user, as the dispatchers summed it. */
export type UsageOf = (day: string, kind: "agent" | "user", name: string) => Promise<Usage>;

/**
 * The check a gateway makes before each call of a job of `agent` for `owner`: why the call may
 * not be made (the agent's or the user's budget that says `stop` is spent today), or undefined.
 * Undefined when neither has such a budget: then the check reads nothing.
 */
export function spentBudgets(
  policy: Pick<SystemPolicy, "budgets">,
  agent: string,
  owner: string,
  usageOf: UsageOf,
): (() => Promise<string | undefined>) | undefined {
  const stops = (
    [
      ["agent", agent, policy.budgets.agents[agent]],
      ["user", owner, policy.budgets.users[owner]],
    ] as const
  ).filter((stop): stop is readonly ["agent" | "user", string, Budget] => stop[2]?.onExceeded === "stop");
  if (stops.length === 0) return undefined;
  return async () => {
    const day = usageDay(Date.now());
    for (const [kind, name, budget] of stops) {
      const used = await usageOf(day, kind, name);
      if (spent(budget, used)) {
        return `${kind} ${name} has spent its budget for ${day} (UTC), which stops its calls (onExceeded: stop): cost ${used.cost}${budget.cost !== undefined ? ` of ${budget.cost}` : ""}, ${used.tokensIn + used.tokensOut} tokens${budget.tokens !== undefined ? ` of ${budget.tokens}` : ""}`;
      }
    }
    return undefined;
  };
}
