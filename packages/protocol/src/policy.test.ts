import { expect, test } from "vitest";
import { DEFAULT_RETENTION_MS, retentionOf, SystemPolicy } from "./policy.js";

const H = 3_600_000;
const policy = (retention: unknown) => SystemPolicy.parse({ retention });

// policy × agent × final state → how long the job (or, with no agent, the run) is kept
test.each([
  ["nothing set: the default for all", {}, "a", "failed", DEFAULT_RETENTION_MS],
  ["the system's jobs period", { jobs: "1h" }, "a", "succeeded", H],
  ["failed falls back to jobs", { jobs: "1h" }, "a", "dead", H],
  ["the system's failed period for failed, timed_out and dead", { jobs: "1h", failed: "2h" }, "a", "timed_out", 2 * H],
  ["cancelled and expired are not failures", { jobs: "1h", failed: "2h" }, "a", "cancelled", H],
  ["an agent's jobs period replaces the system's", { jobs: "1h", agents: { a: { jobs: "3h" } } }, "a", "succeeded", 3 * H],
  ["not another agent's", { jobs: "1h", agents: { b: { jobs: "3h" } } }, "a", "succeeded", H],
  ["the system's failed period stays where the agent sets none", { failed: "2h", agents: { a: { jobs: "3h" } } }, "a", "failed", 2 * H],
  ["failed falls back to the agent's jobs", { jobs: "1h", agents: { a: { jobs: "3h" } } }, "a", "failed", 3 * H],
  ["an agent's failed period replaces the system's", { failed: "2h", agents: { a: { failed: "4h" } } }, "a", "dead", 4 * H],
  ["a run: the system's periods", { jobs: "1h", failed: "2h", agents: { a: { jobs: "3h" } } }, undefined, "failed", 2 * H],
])("%s", (_, retention, agent, state, ms) => {
  expect(retentionOf(policy(retention), state, agent)).toBe(ms);
});

test("a retention period that is not a duration, or an agent name that is not one, is refused with its path", () => {
  const bad = SystemPolicy.safeParse({ retention: { agents: { a: { jobs: "soon" } } } });
  expect(bad.success).toBe(false);
  expect(bad.error?.issues[0]?.path).toEqual(["retention", "agents", "a", "jobs"]);
  const badName = SystemPolicy.safeParse({ retention: { agents: { "no spaces": { jobs: "1h" } } } });
  expect(badName.error?.issues[0]?.path.slice(0, 2)).toEqual(["retention", "agents"]);
});
