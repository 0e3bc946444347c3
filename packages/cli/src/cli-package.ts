import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * The folder of this CLI's package (`packages/cli`), found from wherever its code runs: from
 * `dist/` as `tsc` writes it, or from `dist/bundle/` as the bundle is.
 */
export function cliPackageDir(from = fileURLToPath(import.meta.url)): string {
  for (let dir = dirname(from); dir !== dirname(dir); dir = dirname(dir)) {
    const manifest = join(dir, "package.json");
    if (existsSync(manifest) && (JSON.parse(readFileSync(manifest, "utf8")) as { name?: string }).name === "@boxcar/cli") return dir;
  }
  throw new Error(`no @boxcar/cli package.json above ${from}`);
}
