import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const REPO = fileURLToPath(new URL("../..", import.meta.url));

/**
 * The `boxcar` CLI of an earlier commit of this repository, built as a user would build that
 * release (its own lockfile, `tsc -b`) in a folder of its own, kept for the next run. A string
 * says why there is none: the commit is not in this clone (a shallow one, say).
 */
export async function releaseBin(commit: string): Promise<{ bin: string } | { missing: string }> {
  try {
    await run("git", ["-C", REPO, "cat-file", "-e", `${commit}^{commit}`]);
  } catch {
    return { missing: `commit ${commit} is not in this clone (fetch the full history to run this test)` };
  }
  const dir = join(tmpdir(), `boxcar-release-${commit.slice(0, 12)}`);
  const bin = join(dir, "packages/cli/dist/bin/boxcar.js");
  const built = join(dir, ".built");
  if (existsSync(built)) return { bin };
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  await run("sh", ["-c", 'git -C "$1" archive --format=tar "$2" | tar -x -C "$3"', "sh", REPO, commit, dir]);
  const install = (...flags: string[]) => run("pnpm", ["install", "--frozen-lockfile", ...flags], { cwd: dir, timeout: 300_000 });
  // From the local store when it holds the release's packages; else from the registry pnpm is set up with.
  await install("--offline").catch(() => install("--prefer-offline"));
  await run(join(dir, "node_modules/.bin/tsc"), ["-b"], { cwd: dir, timeout: 300_000 });
  await writeFile(built, `${commit}\n`);
  return { bin };
}
