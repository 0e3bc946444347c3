import { constants } from "node:fs";
import { chmod, type FileHandle, lstat, open, readdir } from "node:fs/promises";
import { join } from "node:path";

/** How often a running agent's workspace is measured against its quota. */
const CHECK_MS = 1_000;

export interface WorkspaceLimits {
  /** Most bytes in the workspace: a file counts its length or the blocks it takes, whichever is more (a sparse file its length, which is what storing it would cost). */
  maxBytes: number;
  /** Most files and folders in it. */
  maxEntries: number;
}

/** How deep a workspace's folders may nest (a `node_modules` tree nests a few dozen). */
const MAX_DEPTH = 256;

/** A workspace the walk cannot measure: breaking the quota, since what it holds is unknown. */
class Unmeasurable extends Error {}

/** Opens a folder without following a symlink in its last segment. */
const FOLDER_FLAGS = constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW;
/** Linux's O_PATH (Node does not name it): a descriptor that pins a file without opening it for reading. */
const O_PATH = 0o10000000;

/**
 * Opens the folder at `path` (one whose parent is pinned, so only its last segment is looked up),
 * never through a symlink. One the agent made unreadable (`chmod 000`, which stops a worker
 * running as the agent's user) is opened up first through a descriptor pinning it, so nothing can
 * be hidden from the count and no symlink swapped in can redirect the `chmod`.
 */
async function openFolder(path: string): Promise<FileHandle | undefined> {
  try {
    return await open(path, FOLDER_FLAGS);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // Gone meanwhile: nothing to count. Out of descriptors, or anything else: it cannot be measured, which is a breach.
    if (code === "ENOENT" || code === "ENOTDIR" || code === "ELOOP") return undefined;
    if (code !== "EACCES") throw new Unmeasurable(`a folder of the workspace could not be opened (${code})`);
  }
  const pin = await open(path, O_PATH | constants.O_NOFOLLOW | constants.O_DIRECTORY).catch(() => undefined);
  if (!pin) return undefined;
  try {
    await chmod(`/proc/self/fd/${pin.fd}`, 0o700);
    return await open(`/proc/self/fd/${pin.fd}`, FOLDER_FLAGS);
  } catch {
    return undefined;
  } finally {
    await pin.close();
  }
}

/**
 * What a folder holds: its entries (files, folders, links and the rest, never followed) and the
 * bytes they take, stopping as soon as either passes `limits`. The agent may be changing the
 * folder meanwhile (a bind-mounted workspace, its container running), and the worker may be root:
 * each folder is opened by a descriptor and read, and its entries looked at, through that
 * descriptor (`/proc/self/fd/N/<name>`), so a folder swapped for a symlink is never followed.
 */
export async function measureWorkspace(
  dir: string,
  limits: WorkspaceLimits,
): Promise<{ bytes: number; entries: number; unmeasurable?: string }> {
  let bytes = 0;
  let entries = 0;
  const over = () => bytes > limits.maxBytes || entries > limits.maxEntries;
  const walk = async (folder: FileHandle, depth: number): Promise<void> => {
    // Each level holds a descriptor: a tree deeper than this is refused, not walked out of descriptors.
    if (depth > MAX_DEPTH) throw new Unmeasurable(`the workspace nests folders more than ${MAX_DEPTH} deep`);
    const pinned = `/proc/self/fd/${folder.fd}`;
    for (const name of await readdir(pinned).catch(() => [])) {
      if (over()) return;
      entries += 1;
      const path = join(pinned, name);
      const stats = await lstat(path).catch(() => undefined);
      bytes += Math.max(stats?.isFile() ? stats.size : 0, (stats?.blocks ?? 0) * 512);
      if (!stats?.isDirectory()) continue;
      const inner = await openFolder(path);
      if (!inner) continue;
      try {
        await walk(inner, depth + 1);
      } finally {
        await inner.close();
      }
    }
  };
  try {
    const root = await openFolder(dir);
    if (root) {
      try {
        await walk(root, 0);
      } finally {
        await root.close();
      }
    }
  } catch (err) {
    if (err instanceof Unmeasurable) return { bytes, entries, unmeasurable: err.message };
    throw err;
  }
  return { bytes, entries };
}

/**
 * Watches a workspace an agent writes into directly (a bind-mounted folder) while it runs, and
 * calls `breached` once, with the reason, when it holds more than `limits` allow. Each look
 * walks the folder (a few ms for thousands of files on a tmpfs); one look at a time.
 */
export class WorkspaceQuota {
  private readonly timer: NodeJS.Timeout;
  private looking = false;
  private done = false;

  constructor(
    private readonly dir: string,
    private readonly limits: WorkspaceLimits,
    private readonly breached: (reason: string) => void,
  ) {
    this.timer = setInterval(() => void this.look(), CHECK_MS);
  }

  stop(): void {
    this.done = true;
    clearInterval(this.timer);
  }

  /** After the agent has ended (and `stop`): one more look, for what it wrote since the last; the breach, if any. */
  async lastLook(): Promise<string | undefined> {
    return this.breachOf(await measureWorkspace(this.dir, this.limits));
  }

  private breachOf({ bytes, entries, unmeasurable }: { bytes: number; entries: number; unmeasurable?: string }): string | undefined {
    if (unmeasurable) return unmeasurable;
    if (bytes > this.limits.maxBytes) return `the workspace took more than its quota of ${this.limits.maxBytes} bytes`;
    if (entries > this.limits.maxEntries) return `the workspace held more than its quota of ${this.limits.maxEntries} files and folders`;
    return undefined;
  }

  private async look(): Promise<void> {
    if (this.looking || this.done) return;
    this.looking = true;
    try {
      const reason = this.breachOf(await measureWorkspace(this.dir, this.limits));
      if (reason && !this.done) {
        this.stop();
        this.breached(reason);
      }
    } finally {
      this.looking = false;
    }
  }
}
