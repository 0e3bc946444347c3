import { lstat, readdir } from "node:fs/promises";
import { join } from "node:path";

/** How often a running agent's workspace is measured against its quota. */
const CHECK_MS = 1_000;

export interface WorkspaceLimits {
  /** Most bytes the workspace may take on disk (allocated blocks: a sparse file counts what it uses). */
  maxBytes: number;
  /** Most files and folders in it. */
  maxEntries: number;
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
    for (const entry of await readdir(folder, { withFileTypes: true }).catch(() => [])) {
      if (over()) return;
      entries += 1;
      const path = join(folder, entry.name);
      const stats = await lstat(path).catch(() => undefined);
      bytes += (stats?.blocks ?? 0) * 512;
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

  private async look(): Promise<void> {
    if (this.looking || this.done) return;
    this.looking = true;
    try {
      const { bytes, entries } = await measureWorkspace(this.dir, this.limits);
      if (this.done) return;
      const reason =
        bytes > this.limits.maxBytes
          ? `the workspace took more than its quota of ${this.limits.maxBytes} bytes`
          : entries > this.limits.maxEntries
            ? `the workspace held more than its quota of ${this.limits.maxEntries} files and folders`
            : undefined;
      if (reason) {
        this.stop();
        this.breached(reason);
      }
    } finally {
      this.looking = false;
    }
  }
}
