import { realpath } from "node:fs/promises";
import { sep } from "node:path";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";

/**
 * The segments of a workspace-relative path. Rejects absolute paths, `..` and NUL bytes, so the
 * path cannot leave the workspace by its spelling alone.
 */
export function workspaceSegments(path: string): string[] {
  const segments = path.split("/").filter((s) => s !== "" && s !== ".");
  if (path.startsWith("/") || path.includes("\0") || segments.length === 0 || segments.includes("..")) {
    throw escapeError(path);
  }
  return segments;
}

/** Throws unless `dir` (which must exist) resolves, symlinks followed, inside `root` (a real path). */
export async function assertInside(root: string, dir: string, path: string): Promise<void> {
  const real = await realpath(dir);
  if (real !== root && !real.startsWith(root + sep)) throw escapeError(path);
}

export function escapeError(path: string): BoxcarError {
  return new BoxcarError(ErrorCode.invalid, `path ${JSON.stringify(path)} leaves the workspace: use a relative path without '..' or symlinks`);
}
