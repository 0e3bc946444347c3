import { z } from "zod";
import { AgentDefinition } from "./agent.js";
import { BoxcarEvent } from "./events.js";
import { JobRecord, JobSpec, WorkItem } from "./job.js";
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
  return Object.fromEntries([...Object.entries(written).map(toJson("input")), ...Object.entries(stored).map(toJson("output"))]);
}
