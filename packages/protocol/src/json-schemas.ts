import { z } from "zod";
import { AgentDefinition } from "./agent.js";
import { API_CONTRACT, apiSchemaFile } from "./api.js";
import { BoxcarEvent } from "./events.js";
import { JobRecord, JobSpec, WorkItem } from "./job.js";
import type { ApiEndpoint } from "./names.js";
import { SystemPolicy } from "./policy.js";
import { WorkerConfig } from "./worker-config.js";
import { WorkerInfo } from "./worker-info.js";
import { WorkflowDefinition, WorkflowRun } from "./workflow.js";

/**
 * The JSON Schemas published for other languages and editors, by file name. What people write
 * (the agent definition file, the job spec, the system policy file, the worker config file and
 * the workflow file) in the shape they write it, before defaults and unit conversion; what
 * Boxcar stores and sends (job records, work items, events, worker presence entries and workflow
 * runs) in the shape a reader finds it, with defaults filled and durations in milliseconds.
 * And for each API endpoint, `api/<endpoint>.schema.json`: its request as a client writes it
 * (`$defs.request`) and the `data` of its reply as a client reads it (`$defs.reply`).
 */
export function jsonSchemas(): Record<string, unknown> {
  const written = {
    "agent.schema.json": AgentDefinition,
    "job-spec.schema.json": JobSpec,
    "policy.schema.json": SystemPolicy,
    "worker-config.schema.json": WorkerConfig,
    "workflow.schema.json": WorkflowDefinition,
  };
  const stored = {
    "job-record.schema.json": JobRecord,
    "work-item.schema.json": WorkItem,
    "event.schema.json": BoxcarEvent,
    "worker.schema.json": WorkerInfo,
    "workflow-run.schema.json": WorkflowRun,
  };
  const toJson =
    (io: "input" | "output") =>
    ([file, schema]: [string, z.ZodType]) => [file, z.toJSONSchema(schema, { io, unrepresentable: "any" })];
  const api = Object.entries(API_CONTRACT).map(([endpoint, { request, reply }]) => [
    apiSchemaFile(endpoint as ApiEndpoint),
    {
      $schema: "https://json-schema.org/draft/2020-12/schema",
      title: `${endpoint}: the request and the reply's data`,
      $defs: { ...nested("request", request, "input"), ...nested("reply", reply, "output") },
    },
  ]);
  return Object.fromEntries([...Object.entries(written).map(toJson("input")), ...Object.entries(stored).map(toJson("output")), ...api]);
}

/**
 * A schema to sit in another document's `$defs` under `name`: without its own `$schema`, and
 * with the definitions it refers to moved up beside it (`<name>.<definition>`), its references
 * rewritten to match.
 */
function nested(name: string, schema: z.ZodType, io: "input" | "output"): Record<string, unknown> {
  const { $schema: _, $defs, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: "any" });
  const defs = ($defs ?? {}) as Record<string, unknown>;
  const moved = JSON.parse(JSON.stringify({ [name]: rest, ...defs }).replaceAll('"#/$defs/', `"#/$defs/${name}.`)) as Record<
    string,
    unknown
  >;
  return Object.fromEntries(Object.entries(moved).map(([key, value]) => [key === name ? key : `${name}.${key}`, value]));
}
