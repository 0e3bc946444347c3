import { AgentDefinition } from "./agent.js";
import { formatPath } from "./errors.js";
import { FileError, fileIssues, locateIn, readYamlDocument } from "./yaml-file.js";

/**
 * A prompt agent's file (docs/harness.md#the-prompt-file), in the Dotprompt format: YAML
 * frontmatter between `---` lines, then the template. The frontmatter holds the agent's fields
 * (`name`, `runtime` or its other name `sandbox`, `pool`, `env`, `secrets`, `outputs`, ...) and
 * the prompt's own (`PROMPT_FIELDS`); the template after it is the prompt. Errors name the file, line, column and field.
 */

/** The frontmatter fields that are the prompt's own (the rest are the agent's). */
const PROMPT_FIELDS = new Set([
  "model",
  "tools",
  "mcp",
  "approval",
  "maxSteps",
  "maxTokens",
  "maxOutputTokens",
  "temperature",
  "compactAt",
  "keepSteps",
  "stuckSteps",
  "doomLoop",
]);

export interface PromptFile {
  definition: AgentDefinition;
  /** The file's line the template starts on (1-based): a template error's line is counted from it. */
  templateLine: number;
  /**
   * Dotprompt's `input.schema`, as written (Picoschema or JSON Schema), and its line: the reader
   * turns it into the agent's `inputSchema` (Picoschema is Dotprompt's own shorthand).
   */
  input?: { schema: unknown; line: number };
}

export function parsePromptFile(text: string, file: string): PromptFile {
  const what = "prompt file";
  const fail = (line: number, message: string, path = ""): never => {
    throw new FileError(what, file, [{ path, message, line, column: 1 }]);
  };
  const lines = text.split("\n");
  if (lines[0]?.trim() !== "---") fail(1, "a prompt file starts with a --- line, then its YAML frontmatter, then --- and the template");
  const close = lines.findIndex((line, i) => i > 0 && line.trim() === "---");
  if (close < 0) fail(1, "its frontmatter has no closing --- line");
  const frontmatter = lines.slice(1, close).join("\n");
  const template = lines.slice(close + 1).join("\n");
  const offset = 1; // the frontmatter's first line is the file's second

  const { doc, lineCounter } = readYamlDocument(frontmatter, file, what, offset);
  const value: unknown = doc.toJS() ?? {};
  if (typeof value !== "object" || Array.isArray(value)) fail(2, "its frontmatter must be a mapping of fields");
  const fields = value as Record<string, unknown>;
  if ("sandbox" in fields && "runtime" in fields) fail(2, "give runtime or sandbox (its other name), not both", "sandbox");
  const agent: Record<string, unknown> = {};
  const prompt: Record<string, unknown> = { template };
  for (const [key, field] of Object.entries(fields)) {
    if (PROMPT_FIELDS.has(key)) prompt[key] = field;
    else agent[key === "sandbox" ? "runtime" : key] = field;
  }
  if ("command" in agent) fail(2, "a prompt agent has no command: its prompt is what runs", "command");
  // Dotprompt's input: { schema }, read by the caller (see PromptFile.input).
  const input = agent.input;
  delete agent.input;
  const inputLine = lineCounter.linePos(locateIn(doc.contents, ["input"])).line + offset;
  if (input !== undefined && (typeof input !== "object" || input === null || !("schema" in input) || Object.keys(input).length !== 1)) {
    fail(inputLine, "input holds one field, schema (Picoschema or JSON Schema)", "input");
  }
  const result = AgentDefinition.safeParse({ ...agent, prompt });
  if (result.success) {
    return {
      definition: result.data,
      templateLine: close + 2,
      ...(input !== undefined ? { input: { schema: (input as { schema: unknown }).schema, line: inputLine } } : {}),
    };
  }
  throw new FileError(
    what,
    file,
    fileIssues(result.error, (path, message) => {
      // In the file, the prompt's fields are at the top, and its template after the frontmatter.
      if (path[0] === "prompt" && path[1] === "template") return { path: "template", message, line: close + 2, column: 1 };
      const inFile =
        path[0] === "prompt" ? path.slice(1) : path[0] === "runtime" && "sandbox" in fields ? ["sandbox", ...path.slice(1)] : path;
      const pos = lineCounter.linePos(locateIn(doc.contents, inFile));
      return { path: formatPath(inFile), message, line: pos.line + offset, column: pos.col };
    }),
  );
}
