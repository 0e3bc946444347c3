import { lstat, mkdir } from "node:fs/promises";
import { join } from "node:path";
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

/** A command's folder in the workspace: its segments joined, or undefined for the workspace itself (`.`). */
export function workspaceCwd(path: string): string | undefined {
  if (!path.startsWith("/") && path.split("/").every((s) => s === "" || s === ".")) return undefined;
  return workspaceSegments(path).join("/");
}

/**
 * The folder `segments` names under `root`, refusing to pass through a symlink (which could
 * lead out of the workspace). Missing folders are created when `create` is set; otherwise a
 * missing folder gives null.
 */
export async function workspaceDir(root: string, segments: readonly string[], path: string, create: boolean): Promise<string | null> {
  let dir = root;
  for (const segment of segments) {
    dir = join(dir, segment);
    let stats = await lstat(dir).catch(ignoreMissing);
    if (!stats) {
      if (!create) return null;
      await mkdir(dir).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== "EEXIST") throw err;
      });
      stats = await lstat(dir);
    }
    if (stats.isSymbolicLink()) throw escapeError(path);
    if (!stats.isDirectory()) throw new BoxcarError(ErrorCode.invalid, `path ${JSON.stringify(path)}: ${segment} is not a folder`);
  }
  return dir;
}

export function escapeError(path: string): BoxcarError {
  return new BoxcarError(
    ErrorCode.invalid,
    `path ${JSON.stringify(path)} leaves the workspace: use a relative path without '..' or symlinks`,
  );
}

function ignoreMissing(err: NodeJS.ErrnoException): null {
  if (err.code === "ENOENT") return null;
  throw err;
}
