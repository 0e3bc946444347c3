/**
 * Builds the dashboard's page into `dist/web`: the TypeScript under `web/` bundled by esbuild
 * into one ES module (Preact, htm and the NATS WebSocket client with it), beside its HTML and CSS.
 * Run by `pnpm run build` after `tsc -b`; `boxcar ui` serves the result.
 */

import { copyFile, mkdir } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const web = fileURLToPath(new URL("../web/", import.meta.url));
const out = fileURLToPath(new URL("./web/", import.meta.url));

await mkdir(out, { recursive: true });
await build({
  entryPoints: [`${web}main.ts`],
  outfile: `${out}app.js`,
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  minify: true,
  legalComments: "linked",
  logLevel: "warning",
});
await copyFile(`${web}index.html`, `${out}index.html`);
await copyFile(`${web}app.css`, `${out}app.css`);
