import { readFileSync } from "node:fs";
import { expect, test } from "vitest";
import { permissionsTable } from "./access.js";
import { names } from "./names.js";

/** Markdown tables compared without the padding a formatter adds. */
const unpadded = (text: string) => text.replace(/-{3,}/g, "---").replace(/ {2,}/g, " ");

test("docs/security.md prints the roles' permissions as the code derives them (run `pnpm docs:permissions` after a change)", () => {
  const doc = readFileSync(new URL("../../../docs/security.md", import.meta.url), "utf8");
  expect(unpadded(doc)).toContain(unpadded(permissionsTable(names())));
});
