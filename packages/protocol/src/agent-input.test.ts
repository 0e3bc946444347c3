import { describe, expect, test } from "vitest";
import { AgentDefinition } from "./agent.js";
import { checkInput } from "./agent-input.js";

describe("an agent's input schema", () => {
  const agent = AgentDefinition.parse({
    name: "sorter",
    command: "true",
    inputSchema: { type: "object", properties: { items: { type: "array", items: { type: "integer" } } }, required: ["items"] },
  });

  test("a matching input passes; one that does not is refused, each problem at its path under input", () => {
    expect(() => checkInput(agent, { items: [3, 1, 2] })).not.toThrow();
    expect(() => checkInput(agent, { items: [1, "two"] })).toThrow(
      expect.objectContaining({ code: "invalid", issues: [expect.objectContaining({ path: "input.items[1]" })] }),
    );
    expect(() => checkInput(agent, null)).toThrow(expect.objectContaining({ code: "invalid" }));
  });

  test("an agent without one takes any input; a schema zod cannot read is refused when the agent is applied", () => {
    expect(() => checkInput(AgentDefinition.parse({ name: "any", command: "true" }), { whatever: 1 })).not.toThrow();
    const bad = AgentDefinition.safeParse({ name: "x", command: "true", inputSchema: { type: "frobnicate" } });
    expect(bad.error?.issues).toEqual([
      expect.objectContaining({ path: ["inputSchema"], message: expect.stringContaining("not a JSON Schema this release can read") }),
    ]);
  });
});
