import { z } from "zod";
import { BoxcarError, ErrorCode, type ErrorIssue, formatPath } from "./errors.js";

/**
 * An agent's input schema (docs/agent-contract.md#input-schema): a JSON Schema its jobs' input
 * must match, checked as each job is admitted (a submit, a workflow step, a handoff, a schedule's
 * tick), so a job with a wrong input is refused with what is wrong and never runs.
 */

/** An input schema as written: a JSON Schema object (draft 2020-12's vocabulary as zod reads it). */
export const InputSchema = z
  .record(z.string(), z.json())
  .refine((schema) => readable(schema) === undefined, {
    error: (issue) => `not a JSON Schema this release can read: ${readable(issue.input as Record<string, unknown>)}`,
  })
  .describe("a JSON Schema the input of each of its jobs must match; checked when a job is admitted");

const compiled = new WeakMap<object, z.ZodType>();

function compile(schema: Record<string, unknown>): z.ZodType {
  let validator = compiled.get(schema);
  if (!validator) {
    validator = z.fromJSONSchema(schema as Parameters<typeof z.fromJSONSchema>[0]);
    compiled.set(schema, validator);
  }
  return validator;
}

/** Why a schema cannot be read, or undefined when it can. */
function readable(schema: Record<string, unknown>): string | undefined {
  try {
    compile(schema);
    return undefined;
  } catch (err) {
    return (err as Error).message.split("\n")[0];
  }
}

/** Refuses an input that does not match the agent's schema (`invalid`, one issue per problem, each at `input.<path>`). */
export function checkInput(agent: { name: string; inputSchema?: Record<string, unknown> | undefined }, input: unknown): void {
  if (!agent.inputSchema) return;
  const result = compile(agent.inputSchema).safeParse(input ?? null);
  if (result.success) return;
  const issues: ErrorIssue[] = result.error.issues.map((issue) => ({ path: formatPath(["input", ...issue.path]), message: issue.message }));
  throw new BoxcarError(
    ErrorCode.invalid,
    `the input does not match agent ${agent.name}'s input schema: ${issues.map((i) => `${i.path}: ${i.message}`).join("; ")}`,
    { issues },
  );
}
