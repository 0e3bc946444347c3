import { z } from "zod";
import { AgentDefinition } from "./agent.js";
import { JobSpec } from "./job.js";

/**
 * The JSON Schemas published for other languages, by file name: the agent definition file and
 * the job spec, in the shape people write (before defaults and unit conversion).
 */
export function jsonSchemas(): Record<string, unknown> {
  const schemas = { "agent.schema.json": AgentDefinition, "job-spec.schema.json": JobSpec };
  return Object.fromEntries(
    Object.entries(schemas).map(([file, schema]) => [file, z.toJSONSchema(schema, { io: "input", unrepresentable: "any" })]),
  );
}
