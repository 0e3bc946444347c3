#!/usr/bin/env node
/** Writes the JSON Schemas of the agent file and the job spec (generated from zod) to a folder. */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { AgentDefinition } from "../agent.js";
import { JobSpec } from "../job.js";

const dir = process.argv[2] ?? "schemas";
mkdirSync(dir, { recursive: true });
const schemas = { "agent.schema.json": AgentDefinition, "job-spec.schema.json": JobSpec };
for (const [file, schema] of Object.entries(schemas)) {
  // "input": the shape people and other languages write, before defaults and unit conversion.
  const json = z.toJSONSchema(schema, { io: "input", unrepresentable: "any" });
  writeFileSync(join(dir, file), `${JSON.stringify(json, null, 2)}\n`);
  process.stdout.write(`wrote ${join(dir, file)}\n`);
}
