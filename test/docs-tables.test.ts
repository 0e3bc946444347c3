import { readFileSync } from "node:fs";
import { jsonSchemas, names } from "@boxcar/protocol";
import { expect, test } from "vitest";

/**
 * The field tables in the docs name every field of the schema they describe, and nothing else:
 * a field added to the code and not to its table (or the other way round) fails here. What
 * each row says is still written by hand.
 */

type Schema = { properties?: Record<string, Schema>; anyOf?: Schema[]; allOf?: Schema[] };

/** The first column's `names` of the first table after the line `marker` in `doc`. */
function tableFields(doc: string, marker: string): string[] {
  const lines = readFileSync(new URL(`../docs/${doc}`, import.meta.url), "utf8").split("\n");
  const start = lines.indexOf(marker);
  if (start < 0) throw new Error(`${doc} has no line ${JSON.stringify(marker)}`);
  const first = lines.findIndex((line, i) => i > start && line.startsWith("|"));
  const rows: string[] = [];
  for (let i = first + 2; i < lines.length && lines[i]?.startsWith("|"); i++) {
    const name = lines[i]
      ?.split("|")[1]
      ?.trim()
      .match(/^`([^`]+)`/)?.[1];
    if (name) rows.push(name);
  }
  return rows.sort();
}

/** The fields of `schema`, with those of the object-valued `nested` ones as `parent.child`. */
function schemaFields(schema: Schema, nested: string[] = []): string[] {
  const properties = schema.properties ?? {};
  return Object.entries(properties)
    .flatMap(([name, sub]) =>
      nested.includes(name) ? Object.keys(objectOf(sub).properties ?? {}).map((child) => `${name}.${child}`) : [name],
    )
    .sort();
}

/** The object schema inside an optional or defaulted one. */
function objectOf(schema: Schema): Schema {
  return schema.properties ? schema : ((schema.anyOf ?? schema.allOf ?? []).find((s) => s.properties) ?? schema);
}

const schemas = jsonSchemas() as Record<string, Schema>;
const agent = schemas["agent.schema.json"] as Schema;

test.each([
  ["agent-contract.md", "### Fields", schemaFields(agent)],
  ["agent-contract.md", "`runtime`:", schemaFields(objectOf(agent.properties?.runtime as Schema), ["limits"])],
  ["nats-api.md", "## Job spec", schemaFields(schemas["job-spec.schema.json"] as Schema)],
  ["nats-api.md", "## Job records", schemaFields(schemas["job-record.schema.json"] as Schema)],
])("%s, the table after %s, names every field of its schema", (doc, marker, fields) => {
  expect(tableFields(doc, marker)).toEqual(fields);
});

test("nats-api.md's names table has every stream and bucket, with the default prefix and with acme-ci", () => {
  const text = readFileSync(new URL("../docs/nats-api.md", import.meta.url), "utf8");
  const table = text.slice(text.indexOf("## Names and the prefix"), text.indexOf("## The request/reply API"));
  const rows = table.split("\n").filter((line) => line.startsWith("| "));
  const column = (i: number) => new Set(rows.map((row) => row.split("|")[i]?.trim().replace(/`/g, "")));
  for (const [prefix, i] of [
    ["boxcar", 3],
    ["acme-ci", 4],
  ] as const) {
    const n = names(prefix);
    expect([...Object.values(n.streams), ...Object.values(n.buckets), n.serviceName].filter((name) => !column(i).has(name))).toEqual([]);
  }
});
