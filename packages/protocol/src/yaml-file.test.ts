import { describe, expect, test } from "vitest";
import { FileError, parseAgentFile } from "./yaml-file.js";

function errorOf(text: string): FileError {
  try {
    parseAgentFile(text, "agents/x.yaml");
  } catch (err) {
    if (err instanceof FileError) return err;
    throw err;
  }
  throw new Error("expected the file to be refused");
}

describe("parseAgentFile", () => {
  test("fills defaults and converts units", () => {
    const agent = parseAgentFile(
      "name: a\ncommand: echo hi\nruntime:\n  timeout: 90s\n  limits:\n    memory: 512Mi\nsecrets: [TOKEN, {name: K, from: WORKER_K}]\n",
      "a.yaml",
    );
    expect(agent).toMatchObject({
      name: "a",
      command: ["sh", "-c", "echo hi"],
      pool: "default",
      runtime: { sandbox: "auto", network: "none", timeout: 90_000, limits: { memory: 512 * 1024 * 1024 } },
      secrets: [
        { name: "TOKEN", from: "TOKEN" },
        { name: "K", from: "WORKER_K" },
      ],
      outputs: ["out/**"],
      handoffs: [],
    });
  });

  test("names the file, line, column and field of each problem", () => {
    const err = errorOf("name: ok\ncommand: [a]\nruntime:\n  sandbox: vm\n  limits:\n    pids: 2\nenv:\n  1BAD: x\n");
    expect(err.message).toContain("agents/x.yaml:4:3: runtime.sandbox:");
    expect(err.message).toContain("agents/x.yaml:6:5: runtime.limits.pids:");
    expect(err.message).toContain("agents/x.yaml:8:3: env.1BAD:");
    expect(err.locations.map((l) => l.path)).toEqual(["runtime.sandbox", "runtime.limits.pids", "env.1BAD"]);
  });

  test("a missing field is reported at the mapping that lacks it", () => {
    const err = errorOf("name: only-a-name\n");
    expect(err.locations).toEqual([
      expect.objectContaining({
        path: "command",
        message: "give the agent a command or a prompt (a .prompt file), one of the two",
        line: 1,
      }),
    ]);
  });

  test("unknown fields, YAML syntax errors and non-mappings are refused", () => {
    expect(errorOf("name: a\ncommand: x\ncomand: y\n").locations).toEqual([
      expect.objectContaining({ path: "comand", message: "unknown field", line: 3, column: 1 }),
    ]);
    expect(errorOf("name: a\ncommand: x\nruntime:\n  timout: 1s\n").locations[0]).toMatchObject({
      path: "runtime.timout",
      line: 4,
      column: 3,
    });
    expect(errorOf("name: a\ncommand: x\nruntime:\n  timeout: true\n").message).toContain(
      'runtime.timeout: expected a duration such as "30s"',
    );
    expect(errorOf("name: a\ncommand: x\n---\nname: b\ncommand: y\n").message).toContain("holds one document");
    expect(errorOf("name: a\ncommand: [x\n").message).toMatch(/agents\/x\.yaml:\d+:\d+: /);
    expect(errorOf("- just\n- a list\n").message).toContain("expected a mapping");
    expect(errorOf("name: a\nname: b\ncommand: x\n").message).toMatch(/unique|duplicate/i);
  });

  test("outputs may not climb out of the workspace", () => {
    expect(errorOf("name: a\ncommand: x\noutputs: ['../etc/**']\n").locations[0]?.path).toBe("outputs[0]");
  });
});
