import { readFileSync } from "node:fs";
import { expect, test } from "vitest";
import { jsonSchemas } from "./json-schemas.js";

test("the committed JSON Schemas in schemas/ match the zod schemas (run `pnpm schemas` after a change)", () => {
  for (const [file, schema] of Object.entries(jsonSchemas())) {
    const committed = JSON.parse(readFileSync(new URL(`../../../schemas/${file}`, import.meta.url), "utf8"));
    expect(committed, file).toEqual(schema);
  }
});
