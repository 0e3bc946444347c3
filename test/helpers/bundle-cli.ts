import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

/**
 * Vitest's global set-up: the CLI's bundle, made again from what `tsc` last wrote, so that the
 * tests run the CLI as `bin/boxcar` does, and never a bundle older than the code.
 */
export default function bundleCli(): void {
  execFileSync(process.execPath, [fileURLToPath(new URL("../../packages/cli/dist/bin/bundle.js", import.meta.url))], { stdio: "inherit" });
}
