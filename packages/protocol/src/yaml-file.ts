import { type Document, isMap, isSeq, LineCounter, type Node, parseDocument } from "yaml";
import type { z } from "zod";
import { AgentDefinition } from "./agent.js";
import { BoxcarError, ErrorCode, type ErrorIssue, formatPath } from "./errors.js";
import { SystemPolicy } from "./policy.js";
import { WorkflowDefinition } from "./workflow.js";

/** A problem in a YAML file, located by line and column (1-based). */
export interface FileIssue extends ErrorIssue {
  line: number;
  column: number;
}

/** A YAML file (an agent definition, a worker config) that does not match its schema. */
export class FileError extends BoxcarError {
  override readonly name = "FileError";
  readonly file: string;
  readonly locations: readonly FileIssue[];

  constructor(what: string, file: string, locations: readonly FileIssue[]) {
    const lines = locations.map((l) => `${file}:${l.line}:${l.column}: ${l.path ? `${l.path}: ` : ""}${l.message}`);
    super(ErrorCode.invalid, `invalid ${what}\n${lines.join("\n")}`, { issues: locations });
    this.file = file;
    this.locations = locations;
  }
}

/**
 * Parses one agent definition from YAML text. Errors name the file, line, column and field.
 * `file` is only used in messages.
 */
export function parseAgentFile(text: string, file: string): AgentDefinition {
  return parseYamlFile(text, file, AgentDefinition, "agent file");
}

/** Parses a system policy from YAML text; errors name the file, line, column and field. */
export function parsePolicyFile(text: string, file: string): SystemPolicy {
  return parseYamlFile(text, file, SystemPolicy, "policy file");
}

/** Parses one workflow definition from YAML text; errors name the file, line, column and field. */
export function parseWorkflowFile(text: string, file: string): WorkflowDefinition {
  return parseYamlFile(text, file, WorkflowDefinition, "workflow file");
}

/**
 * Parses one YAML document and validates it with `schema`. Errors (`FileError`) name the file,
 * line, column and field of every problem; `what` names the kind of file in the message.
 */
export function parseYamlFile<S extends z.ZodType>(text: string, file: string, schema: S, what: string): z.infer<S> {
  const { doc, lineCounter } = readYamlDocument(text, file, what);
  const value: unknown = doc.toJS();
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new FileError(what, file, [{ path: "", message: "expected a mapping of fields", line: 1, column: 1 }]);
  }
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  throw new FileError(
    what,
    file,
    fileIssues(result.error, (path, message) => {
      const pos = lineCounter.linePos(locateIn(doc.contents, path));
      return { path: formatPath(path), message, line: pos.line, column: pos.col };
    }),
  );
}

/**
 * One YAML document read from `text`, with the line counter that locates its nodes; its syntax
 * errors thrown as a `FileError` whose lines are the file's (`lineOffset`: the lines before
 * `text` in the file, as a prompt file's frontmatter has one).
 */
export function readYamlDocument(text: string, file: string, what: string, lineOffset = 0): { doc: Document; lineCounter: LineCounter } {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, prettyErrors: false, uniqueKeys: true });
  if (doc.errors.length > 0) {
    throw new FileError(
      what,
      file,
      doc.errors.map((e) => {
        const pos = lineCounter.linePos(e.pos[0]);
        const message =
          e.code === "MULTIPLE_DOCS" ? `a ${what} holds one document: split it into files` : (e.message.split("\n")[0] ?? e.message);
        return { path: "", message, line: pos.line + lineOffset, column: pos.col };
      }),
    );
  }
  return { doc, lineCounter };
}

/** A schema's issues as a file's, each placed by `at`; an unknown field is reported at the field itself, one issue per field. */
export function fileIssues(error: z.ZodError, at: (path: PropertyKey[], message: string) => FileIssue): FileIssue[] {
  return error.issues.flatMap((issue) => {
    const paths = issue.code === "unrecognized_keys" ? issue.keys.map((key) => [...issue.path, key]) : [issue.path];
    const message = issue.code === "unrecognized_keys" ? "unknown field" : issue.message;
    return paths.map((path) => at(path, message));
  });
}

/**
 * Where a field path (`steps[1].agent`, or its segments) lies in YAML text: the line and column
 * (1-based) of its key, or of the deepest part of the path that exists. Undefined when the text
 * is not YAML. Lets a caller point at the file line of an error the server reported by path.
 */
export function locateYamlPath(text: string, path: string | readonly PropertyKey[]): { line: number; column: number } | undefined {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, prettyErrors: false });
  if (doc.errors.length > 0) return undefined;
  const segments =
    typeof path === "string"
      ? [...path.matchAll(/([^.[\]]+)|\[(\d+)\]/g)].map((m) => (m[2] !== undefined ? Number(m[2]) : (m[1] as string)))
      : path;
  const pos = lineCounter.linePos(locateIn(doc.contents, segments));
  return { line: pos.line, column: pos.col };
}

/** Offset of the deepest node on `path` that exists: the key of a bad field, or its parent. */
export function locateIn(root: unknown, path: readonly PropertyKey[]): number {
  let node = root as Node | null | undefined;
  let offset = node?.range?.[0] ?? 0;
  for (const seg of path) {
    if (isMap(node)) {
      const pair = node.items.find((p) => (p.key as { value?: unknown } | null)?.value === seg);
      if (!pair) break;
      offset = (pair.key as Node).range?.[0] ?? offset;
      node = pair.value as Node | null;
    } else if (isSeq(node) && typeof seg === "number") {
      const item = node.items[seg] as Node | undefined;
      if (!item) break;
      offset = item.range?.[0] ?? offset;
      node = item;
    } else {
      break;
    }
  }
  return offset;
}
