import { expect, test } from "vitest";
import { docTables, writeDocTable } from "./doc-tables.js";
import { names } from "./names.js";

test("both names tables have every stream and bucket: their rows are listed by hand", () => {
  const n = names();
  for (const table of docTables().filter(({ id }) => id === "names")) {
    const missing = [...Object.values(n.streams), ...Object.values(n.buckets)].filter((name) => !table.markdown.includes(`\`${name}\``));
    expect(missing, table.doc).toEqual([]);
  }
});

test("a table is written between its markers, and again in the same place", () => {
  const table = { doc: "x.md", id: "t", markdown: "| a |\n| --- |\n| 1 |" };
  const doc = "before\n\n<!-- docs:tables t begin -->\nold\n<!-- docs:tables t end -->\n\nafter\n";
  const once = writeDocTable(doc, table);
  expect(once).toBe("before\n\n<!-- docs:tables t begin -->\n| a |\n| --- |\n| 1 |\n<!-- docs:tables t end -->\n\nafter\n");
  expect(writeDocTable(once, table)).toBe(once);
  expect(() => writeDocTable("no markers", table)).toThrow(/docs\/x.md has no <!-- docs:tables t begin -->/);
});
