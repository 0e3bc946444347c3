import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** Where browser tests save their screenshots, for a person to look at (not checked in). */
export const SCREENSHOTS = fileURLToPath(new URL("../../.boxcar/screenshots", import.meta.url));

/**
 * The Chromium browser tests drive: `$BOXCAR_CHROMIUM`, else Debian's `/usr/bin/chromium`
 * (`scripts/test.sh` installs it). Undefined when there is none; with `BOXCAR_REQUIRE_BROWSER`
 * set (CI) that is an error, so the browser tests are never skipped there.
 */
export function browserPath(): string | undefined {
  const path = [process.env.BOXCAR_CHROMIUM, "/usr/bin/chromium"].find((p) => p && existsSync(p));
  if (!path && process.env.BOXCAR_REQUIRE_BROWSER) {
    throw new Error("BOXCAR_REQUIRE_BROWSER is set but no Chromium was found: install Debian's chromium or set BOXCAR_CHROMIUM");
  }
  return path;
}
