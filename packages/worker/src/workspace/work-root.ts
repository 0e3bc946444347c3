import { accessSync, constants, statfsSync } from "node:fs";
import { tmpdir } from "node:os";

/** The file-system type number Linux gives a tmpfs (`statfs(2)`). */
const TMPFS_MAGIC = 0x01021994;
/** A tmpfs smaller than this (a container's default 64 MiB `/dev/shm`, say) is not used by default. */
const MIN_TMPFS_BYTES = 1024 ** 3;
/** Nor one with less than this free. */
const MIN_TMPFS_FREE_BYTES = 512 * 1024 ** 2;

/**
 * Where workspaces are staged when the worker's config names no `workRoot`: the memory-backed
 * `/dev/shm` when it is a tmpfs of at least 1 GiB with 512 MiB free that this user can write,
 * else the OS temporary folder. A workspace on disk costs a job milliseconds of file-system
 * calls; in memory, a fraction of one (docs/benchmarks.md).
 */
export function defaultWorkRoot(shm = "/dev/shm"): string {
  return isRoomyTmpfs(shm) ? shm : tmpdir();
}

function isRoomyTmpfs(dir: string): boolean {
  try {
    const fs = statfsSync(dir);
    accessSync(dir, constants.W_OK | constants.X_OK);
    return fs.type === TMPFS_MAGIC && fs.blocks * fs.bsize >= MIN_TMPFS_BYTES && fs.bavail * fs.bsize >= MIN_TMPFS_FREE_BYTES;
  } catch {
    return false;
  }
}
