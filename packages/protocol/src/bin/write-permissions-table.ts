/** Rewrites the roles' permission table in a Markdown file, between `<!-- permissions -->` markers. */
import { readFileSync, writeFileSync } from "node:fs";
import { names, permissionsTable } from "../internal.js";

const file = process.argv[2];
if (!file) throw new Error("usage: write-permissions-table FILE.md");
const text = readFileSync(file, "utf8");
const begin = "<!-- permissions:begin -->";
const end = "<!-- permissions:end -->";
const [head, rest] = text.split(begin);
const tail = rest?.split(end)[1];
if (head === undefined || tail === undefined) throw new Error(`${file} has no ${begin} ... ${end} markers`);
writeFileSync(file, `${head}${begin}\n${permissionsTable(names())}\n${end}${tail}`);
