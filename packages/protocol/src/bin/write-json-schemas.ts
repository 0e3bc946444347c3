#!/usr/bin/env node
/** Writes the published JSON Schemas (generated from zod) to a folder, `schemas/` by default. */
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { jsonSchemas } from "../json-schemas.js";

const dir = process.argv[2] ?? "schemas";
for (const [file, schema] of Object.entries(jsonSchemas())) {
  mkdirSync(dirname(join(dir, file)), { recursive: true });
  writeFileSync(join(dir, file), `${JSON.stringify(schema, null, 2)}\n`);
  process.stdout.write(`wrote ${join(dir, file)}\n`);
}
