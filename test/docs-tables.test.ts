import { readFileSync } from "node:fs";
import { ApiEndpoint, docTableMarkers, docTableRegion, docTables, names, READ_ENDPOINTS, ROLE_ENDPOINTS } from "@boxcar/protocol";
import { expect, test } from "vitest";

/**
 * The docs' tables of fields, job states, error codes and names are generated from the code
 * (`pnpm docs:tables`, from `doc-tables.ts` in protocol): a committed one that differs from what
 * the code writes now fails here, so a field, state, code or stream cannot be added, changed or
 * removed in one and not the other.
 */

const docText = (doc: string) => readFileSync(new URL(`../docs/${doc}`, import.meta.url), "utf8");

/**
 * A table without its padding. The generator writes tables unpadded and Biome pads their cells
 * when it formats the docs (`pnpm docs:tables` runs it, and `pnpm lint` checks it), so both sides
 * are compared as Biome's padding leaves them: however wide it makes a column, the test holds.
 */
const unpadded = (table: string) => table.replace(/-{3,}/g, "---").replace(/ {2,}/g, " ");

test.each(docTables().map((table) => [table.doc, table.id, table.markdown]))("docs/%s: the %s table is the code's", (doc, id, markdown) => {
  const { begin, end } = docTableMarkers(id);
  const committed = docTableRegion(docText(doc), id);
  expect(committed, `docs/${doc} has no ${begin} ... ${end} markers`).toBeDefined();
  expect(unpadded(committed ?? ""), `docs/${doc}: the ${id} table differs from the code: run pnpm docs:tables`).toBe(unpadded(markdown));
});

test("architecture.md's tables of stream and bucket limits, written by hand from fabric's topology, have every stream and bucket", () => {
  const text = docText("architecture.md");
  const section = text.slice(text.indexOf("## Streams, buckets and their limits"), text.indexOf("## The path of a job"));
  const first = (line: string) => line.split("|")[1]?.match(/`([^`]+)`/)?.[1];
  const listed = new Set(
    section
      .split("\n")
      .filter((line) => line.startsWith("| `"))
      .map(first),
  );
  const n = names();
  expect([...Object.values(n.streams), ...Object.values(n.buckets)].filter((name) => !listed.has(name))).toEqual([]);
});

test("nats-api.md's endpoint table, written by hand, has a row for every endpoint, and its role table names what access.ts lets each role call", () => {
  const text = docText("nats-api.md");
  const rows = new Set([...text.matchAll(/^\| `boxcar\.api\.<role>\.<user>\.([a-z.]+)`/gm)].map((m) => m[1]));
  expect(Object.values(ApiEndpoint).filter((endpoint) => !rows.has(endpoint))).toEqual([]);
  const roleLine = (role: string) => text.split("\n").find((line) => line.startsWith(`| \`${role}\``)) ?? "";
  const named = (line: string) => new Set([...line.matchAll(/`([a-z]+\.[a-z.]+)`/g)].map((m) => m[1]));
  const reads = new Set(READ_ENDPOINTS);
  expect(named(roleLine("viewer"))).toEqual(new Set(ROLE_ENDPOINTS.viewer));
  expect(named(roleLine("submitter"))).toEqual(new Set([...ROLE_ENDPOINTS.submitter].filter((e) => !reads.has(e))));
});
