/**
 * A session's files read by ranges, written in parts, hashed, and the room its workspace takes:
 * what big files streamed both ways are made of (docs/sessions.md#big-files). A Docker session's
 * go through its helper, inside the container (a part read from an offset, a part added to a
 * file, a hash read whole there); a host session's are read and written here, never through a
 * symlink. An E2B session's are not built yet.
 */

import { createHash } from "node:crypto";
import { constants } from "node:fs";
import { type FileHandle, open } from "node:fs/promises";
import { join } from "node:path";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { SessionSandbox } from "../sandbox/sandbox.js";
import type { PartFiles } from "../sandbox/session-job-sandbox.js";
import type { SessionFiles } from "../workspace/files.js";
import { escapeError, workspaceDir, workspaceSegments } from "../workspace/workspace-path.js";
import { measureWorkspace } from "../workspace/workspace-quota.js";
import type { HeldSession } from "./held-session.js";
import { askHelper, notBuilt } from "./helper-verbs.js";

/** How long a hash of a file (up to a workspace's 1 GiB) may take in the session. */
const HASH_TIMEOUT_MS = 120_000;

export interface Hashed {
  size: number;
  sha256: string;
  executable: boolean;
}

export interface RangedFiles {
  /** Up to `length` bytes of the file from `offset`, and its whole size; null when there is no such regular file. */
  readPart(path: string, offset: number, length: number): Promise<{ data: Uint8Array; size: number } | null>;
  /** The file's size; null when there is no such regular file. */
  sizeOf(path: string): Promise<number | null>;
  /** Writes `data` as the whole file (making its folders), or adds it to the file's end (`append`). */
  writePart(path: string, data: Uint8Array, append: boolean, executable: boolean): Promise<void>;
  isFolder(path: string): Promise<boolean>;
  /** The file's size and SHA-256 (hex), read whole, and whether it is executable; null when there is no such regular file. */
  hash(path: string): Promise<Hashed | null>;
  /** What the workspace takes, in bytes, as its quota counts it (a file its length or blocks, whichever is more). */
  used(): Promise<number>;
}

/** The session's files by ranges; E2B sessions' are not built (refused, saying so). */
export function rangedFilesOf(held: HeldSession, what: string): RangedFiles {
  const { sandbox } = held;
  const kind = held.record.sandbox.kind;
  if (kind === "docker" && hasParts(sandbox.sessionFiles)) return new HelperRangedFiles(sandbox.sessionFiles, sandbox);
  if (kind === "host") return new LocalRangedFiles(sandbox.workspace);
  throw notBuilt(kind, what);
}

function hasParts(files: SessionFiles): files is SessionFiles & PartFiles {
  const parts = files as Partial<PartFiles>;
  return typeof parts.readPart === "function" && typeof parts.mkdir === "function";
}

/** What a folder of this machine takes (a host session's, or a Docker session's bind-mounted one), walked by descriptor. */
async function usedIn(folder: string | undefined): Promise<number> {
  if (folder === undefined) throw new BoxcarError(ErrorCode.invalid, "this session's workspace cannot be measured here");
  const measured = await measureWorkspace(folder, { maxBytes: Number.MAX_SAFE_INTEGER, maxEntries: Number.MAX_SAFE_INTEGER });
  if (measured.unmeasurable)
    throw new BoxcarError(ErrorCode.conflict, `the session's workspace cannot be measured: ${measured.unmeasurable}`);
  return measured.bytes;
}

/** A Docker session's: its helper reads and writes inside the container. */
class HelperRangedFiles implements RangedFiles {
  constructor(
    private readonly files: SessionFiles & PartFiles,
    private readonly sandbox: SessionSandbox & { readonly localFolder?: string },
  ) {}

  readPart(path: string, offset: number, length: number) {
    return this.files.readPart(path, offset, length);
  }

  async sizeOf(path: string): Promise<number | null> {
    return (await this.files.readPart(path, 0, 0))?.size ?? null;
  }

  writePart(path: string, data: Uint8Array, append: boolean, executable: boolean): Promise<void> {
    return this.files.write(path, data, executable, append);
  }

  async isFolder(path: string): Promise<boolean> {
    try {
      await this.files.list(path, 1);
      return true;
    } catch (err) {
      if (err instanceof BoxcarError && err.code === ErrorCode.notFound) return false;
      throw err;
    }
  }

  async hash(path: string): Promise<Hashed | null> {
    const answer = await askHelper(this.sandbox, ["hash", workspaceSegments(path).join("/")], { timeoutMs: HASH_TIMEOUT_MS });
    if (answer.code === 2) return null;
    if (answer.code !== 0) throw new BoxcarError(ErrorCode.invalid, `cannot hash ${path}: ${answer.stderr || `exit ${answer.code}`}`);
    const said = parseHash(answer.stdout);
    if (!said) throw new BoxcarError(ErrorCode.sandboxFailed, `the session's helper answered a hash of ${path} with no hash`);
    return said;
  }

  used(): Promise<number> {
    // The walk the workspace's quota makes: by descriptor, never through a symlink a command swaps in.
    return usedIn(this.sandbox.localFolder);
  }
}

function parseHash(text: string): Hashed | undefined {
  try {
    const said = JSON.parse(text.trim()) as { size?: unknown; sha256?: unknown; executable?: unknown };
    if (
      Number.isSafeInteger(said.size) &&
      (said.size as number) >= 0 &&
      typeof said.sha256 === "string" &&
      /^[0-9a-f]{64}$/.test(said.sha256)
    ) {
      return { size: said.size as number, sha256: said.sha256, executable: said.executable === true };
    }
  } catch {
    // not JSON: no hash
  }
  return undefined;
}

/** Opening a file of a host session's workspace: never through a symlink (its last segment), never held by a named pipe. */
const READ = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;
const WRITE = constants.O_WRONLY | constants.O_CREAT | constants.O_NOFOLLOW | constants.O_NONBLOCK;

/** A host session's: its workspace is a folder of this machine (an admin's session; its commands run as the worker anyway). */
class LocalRangedFiles implements RangedFiles {
  constructor(private readonly root: string) {}

  async readPart(path: string, offset: number, length: number): Promise<{ data: Uint8Array; size: number } | null> {
    const file = await this.openFile(path, READ, false);
    if (!file) return null;
    try {
      const { size } = await file.stat();
      const data = Buffer.alloc(Math.max(0, Math.min(length, size - offset)));
      const { bytesRead } = await file.read(data, 0, data.length, offset);
      return { data: data.subarray(0, bytesRead), size };
    } finally {
      await file.close();
    }
  }

  async sizeOf(path: string): Promise<number | null> {
    return (await this.readPart(path, 0, 0))?.size ?? null;
  }

  async writePart(path: string, data: Uint8Array, append: boolean, executable: boolean): Promise<void> {
    const file = await this.openFile(path, WRITE | (append ? constants.O_APPEND : constants.O_TRUNC), true);
    if (!file) throw new BoxcarError(ErrorCode.invalid, `cannot write ${path}: it is not a regular file`);
    try {
      await file.write(data);
      if (executable) await file.chmod(0o755);
    } finally {
      await file.close();
    }
  }

  async isFolder(path: string): Promise<boolean> {
    return (await workspaceDir(this.root, workspaceSegments(path), path, false)) !== null;
  }

  async hash(path: string): Promise<Hashed | null> {
    const file = await this.openFile(path, READ, false);
    if (!file) return null;
    try {
      const executable = ((await file.stat()).mode & 0o111) !== 0;
      const hash = createHash("sha256");
      let size = 0;
      for await (const chunk of file.createReadStream({ autoClose: false })) {
        size += (chunk as Buffer).length;
        hash.update(chunk as Buffer);
      }
      return { size, sha256: hash.digest("hex"), executable };
    } finally {
      await file.close();
    }
  }

  used(): Promise<number> {
    return usedIn(this.root);
  }

  /** The regular file at `path`, opened with `flags`; null when there is none (or it is no regular file). `create`: its folders are made. */
  private async openFile(path: string, flags: number, create: boolean): Promise<FileHandle | null> {
    const segments = workspaceSegments(path);
    const dir = await workspaceDir(this.root, segments.slice(0, -1), path, create);
    if (dir === null) return null;
    let file: FileHandle;
    try {
      file = await open(join(dir, segments.at(-1) as string), flags, 0o644);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === "ELOOP") throw escapeError(path);
      if (code === "ENOENT" || code === "ENXIO" || code === "EISDIR") return null;
      throw err;
    }
    if (!(await file.stat()).isFile()) {
      await file.close();
      return null;
    }
    return file;
  }
}
