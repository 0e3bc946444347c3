import { describe, expect, test } from "vitest";
import { parsePromptFile } from "./prompt-file.js";
import { FileError } from "./yaml-file.js";

const errorOf = (text: string): FileError => {
  try {
    parsePromptFile(text, "agents/x.prompt");
  } catch (err) {
    if (err instanceof FileError) return err;
    throw err;
  }
  throw new Error("no error");
};

describe("a prompt file", () => {
  test("its frontmatter holds the agent's fields and the prompt's; the template is what follows", () => {
    const { definition, templateLine } = parsePromptFile(
      "---\nname: fixer\nmodel: anthropic/claude-x\ntools: [bash, read_file]\nsandbox: { sandbox: docker, timeout: 2m }\nmaxSteps: 5\n---\nFix {{thing}}.\n",
      "x.prompt",
    );
    expect(templateLine).toBe(8);
    expect(definition).toMatchObject({
      name: "fixer",
      runtime: { sandbox: "docker", timeout: 120_000, network: "none" },
      prompt: { model: "anthropic/claude-x", tools: ["bash", "read_file"], maxSteps: 5, template: "Fix {{thing}}.\n", doomLoop: 3 },
    });
    expect(definition.command).toBeUndefined();
  });

  test("errors name the file's line and field: a bad model, an unknown tool, a field of neither", () => {
    const err = errorOf("---\nname: bad\nmodel: claude\ntools: [bash, rm_rf]\nmaxStep: 3\n---\nhi\n");
    expect(err.locations).toEqual([
      expect.objectContaining({ path: "model", line: 3, message: expect.stringContaining("must be provider/model") }),
      expect.objectContaining({ path: "tools[1]", line: 4, message: expect.stringContaining('unknown tool "rm_rf"') }),
      expect.objectContaining({ path: "maxStep", line: 5, message: "unknown field" }),
    ]);
    expect(err.message).toContain("agents/x.prompt:4:15: tools[1]:");
  });

  test("a file without frontmatter, YAML that does not parse, a command, an empty template and both runtime and sandbox are refused", () => {
    expect(errorOf("hello\n").message).toContain("starts with a --- line");
    expect(errorOf("---\nname: a\n").message).toContain("no closing --- line");
    expect(errorOf("---\nname: [a\n---\nhi\n").locations[0]).toMatchObject({ line: 2 });
    expect(errorOf("---\nname: a\nmodel: openai/gpt-4o\ncommand: ls\n---\nhi\n").message).toContain("has no command");
    expect(errorOf("---\nname: a\nmodel: openai/gpt-4o\n---\n").locations).toEqual([
      expect.objectContaining({ path: "template", line: 5, message: "the prompt's template is empty" }),
    ]);
    expect(errorOf("---\nname: a\nmodel: openai/gpt-4o\nruntime: {}\nsandbox: {}\n---\nhi\n").message).toContain("not both");
  });

  test("every prompt field may be in the frontmatter; a tool that needs approval must be one of the tools", () => {
    const { definition } = parsePromptFile(
      "---\nname: a\nmodel: openai/gpt-4o\ntools: [bash]\napproval: [bash]\nmaxTokens: 9000\nmaxOutputTokens: 100\ntemperature: 0\ncompactAt: 5000\nkeepSteps: 2\ndoomLoop: 4\n---\nhi\n",
      "x.prompt",
    );
    expect(definition.prompt).toMatchObject({
      approval: ["bash"],
      maxTokens: 9000,
      maxOutputTokens: 100,
      temperature: 0,
      compactAt: 5000,
      keepSteps: 2,
      doomLoop: 4,
    });
    expect(errorOf("---\nname: a\nmodel: openai/gpt-4o\ntools: [grep]\napproval: [bash]\n---\nhi\n").locations).toEqual([
      expect.objectContaining({ path: "approval", line: 5, message: "a tool that waits for approval must be one of the agent's tools" }),
    ]);
  });

  test("models.providers, when given, must include the model's provider", () => {
    expect(errorOf("---\nname: a\nmodel: openai/gpt-4o\nmodels: { providers: [anthropic] }\n---\nhi\n").locations).toEqual([
      expect.objectContaining({ path: "models.providers", message: "models.providers must include the provider of prompt.model" }),
    ]);
  });
});
