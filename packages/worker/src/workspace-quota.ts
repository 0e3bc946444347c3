import { chmod, lstat, readdir } from "node:fs/promises";
import { join } from "node:path";

/** How often a running agent's workspace is measured against its quota. */
const CHECK_MS = 1_000;

export interface WorkspaceLimits {
  /** Most bytes in the workspace: a file counts its length or the blocks it takes, whichever is more (a sparse file its length, which is what storing it would cost). */
  maxBytes: number;
  /** Most files and folders in it. */
  maxEntries: number;
}

/**
 * A folder's entries. One the agent made unreadable (`chmod 000`; a worker running as the
 * agent's user owns it) is opened up first, so nothing can be hidden from the count.
 */
async function listFolder(folder: string) {
  try {
    return await readdir(folder, { withFileTypes: true });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EACCES") return [];
    await chmod(folder, 0o700).catch(() => {});
    return readdir(folder, { withFileTypes: true }).catch(() => []);
  }
}

/**
 * What a folder holds: its entries (files, folders, links and the rest, never followed) and the
 * bytes they take, stopping as soon as either passes `limits`.
 */
export async function measureWorkspace(dir: string, limits: WorkspaceLimits): Promise<{ bytes: number; entries: number }> {
  let bytes = 0;
  let entries = 0;
  const over = () => bytes > limits.maxBytes || entries > limits.maxEntries;
  const walk = async (folder: string): Promise<void> => {
    for (const entry of await listFolder(folder)) {
      if (over()) return;
      entries += 1;
      const path = join(folder, entry.name);
      const stats = await lstat(path).catch(() => undefined);
      bytes += Math.max(stats?.isFile() ? stats.size : 0, (stats?.blocks ?? 0) * 512);
      if (entry.isDirectory()) await walk(path);
    }
  };
  await walk(dir);
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

  private breachOf({ bytes, entries }: { bytes: number; entries: number }): string | undefined {
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
