import { z } from "zod";
import { AgentDefinition } from "./agent.js";
import { JobSpec } from "./job.js";
import { SystemPolicy } from "./policy.js";
import { WorkerConfig } from "./worker-config.js";
import { WorkflowDefinition } from "./workflow.js";

/**
 * The JSON Schemas published for other languages and editors, by file name: the agent
 * definition file, the job spec, the system policy file and the worker config file, in the shape people write (before
 * defaults and unit conversion).
 */
export function jsonSchemas(): Record<string, unknown> {
  const schemas = {
    "agent.schema.json": AgentDefinition,
    "job-spec.schema.json": JobSpec,
    "policy.schema.json": SystemPolicy,
    "worker-config.schema.json": WorkerConfig,
    "workflow.schema.json": WorkflowDefinition,
  };
  return Object.fromEntries(
    Object.entries(schemas).map(([file, schema]) => [file, z.toJSONSchema(schema, { io: "input", unrepresentable: "any" })]),
  );
}
