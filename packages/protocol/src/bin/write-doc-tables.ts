/** Rewrites the generated tables in the docs folder given (`docs`), each between its `docs:tables` markers. */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { docTables, writeDocTable } from "../internal.js";

const dir = process.argv[2];
if (!dir) throw new Error("usage: write-doc-tables DOCS_FOLDER");
const tables = docTables();
for (const doc of new Set(tables.map((table) => table.doc))) {
  const file = join(dir, doc);
  const text = tables.filter((table) => table.doc === doc).reduce(writeDocTable, readFileSync(file, "utf8"));
  writeFileSync(file, text);
}
