/** A workspace's files as sandboxes and sessions show them, whatever holds them. */

export interface WorkspaceFile {
  /** Workspace-relative, `/`-separated. */
  path: string;
  size: number;
}

/** A session's files, read and written while its commands may be running. Paths as a sandbox's. */
export interface SessionFiles {
  /** The file's bytes, or null when there is no such regular file; one of more than `max` bytes is refused (`too_large`). */
  read(path: string, max: number): Promise<Uint8Array | null>;
  /** Writes a file, creating its parent folders and replacing what was there; `executable`: mode 0755. */
  write(path: string, data: Uint8Array, executable?: boolean): Promise<void>;
  /** The regular files under `path` (default: all), by path; `truncated` when there were more than `limit` (or too many bytes of them); a missing folder is `not_found`. */
  list(path: string | undefined, limit: number): Promise<{ files: WorkspaceFile[]; truncated: boolean }>;
  /** Removes a file or a folder with what it holds; false when there was none. */
  remove(path: string): Promise<boolean>;
}
