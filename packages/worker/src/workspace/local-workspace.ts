import { execFile } from "node:child_process";
import { constants } from "node:fs";
import { chmod, type FileHandle, lstat, mkdir, mkdtemp, open, readdir, realpath, rm } from "node:fs/promises";
import { join } from "node:path";
import { Readable } from "node:stream";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { SessionFiles, WorkspaceFile } from "./files.js";
import { escapeError, workspaceDir, workspaceSegments } from "./workspace-path.js";

const WRITE_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW;
// Non-blocking: an agent's named pipe where a file is expected is refused, not waited on for ever.
const READ_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;

/** Which worker of which system made a workspace, for which sandbox: its folder's name says so. */
export interface WorkspaceOwner {
  workerId: string;
  sandboxId: string;
}

/**
 * A workspace folder's name: `boxcar-<system>~<worker>~<sandbox>-` and `mkdtemp`'s six
 * characters. The system and worker in it let a worker tell a gone worker's leftovers from a
 * live one's, and from another system's on the same machine (`WorkspaceRoot.sweep`).
 */
const WORKSPACE_FOLDER = /^boxcar-([^~]+)~([^~]+)~([^~]+)-[A-Za-z0-9]{6}$/;

/** The owner a folder's name says, if it is a workspace named so. */
export function workspaceOwnerOf(folder: string): (WorkspaceOwner & { system: string }) | undefined {
  const m = WORKSPACE_FOLDER.exec(folder);
  return m ? { system: m[1] as string, workerId: m[2] as string, sandboxId: m[3] as string } : undefined;
}

/**
 * The folder workspaces are made in. It is created and resolved to its real path once, not for
 * every workspace: each job then costs one `mkdtemp` here.
 */
export class WorkspaceRoot {
  private real: Promise<string> | undefined;

  /** The system's identity as it appears in names (`-`: none known; such workspaces are never swept). */
  private readonly system: string;

  /** `system`: the system's identity (`Topology.systemId`), written into every workspace's name. */
  constructor(
    readonly path: string,
    system?: string,
  ) {
    // A path that engines and tools take as it is: no `:` (Docker's -v syntax) or `~` (the separator).
    this.system = system ? system.replace(/[^A-Za-z0-9_.-]/g, "_") : "-";
  }

  /** A new empty workspace, readable by this user only (mode 0700), named after its owner. */
  async create(owner: WorkspaceOwner): Promise<LocalWorkspace> {
    try {
      const name = `boxcar-${this.system}~${owner.workerId}~${owner.sandboxId}-`;
      return new LocalWorkspace(await mkdtemp(join(await this.realPath(), name)));
    } catch (err) {
      // Removed while the worker runs (a cleaned temporary folder, say): made again next time.
      this.real = undefined;
      throw err;
    }
  }

  /**
   * Removes the workspaces this system's gone workers left here (killed before they could):
   * those whose worker `gone` says so, asked once per worker. Another system's, this worker's
   * own and unnamed folders are left alone. Returns how many it removed.
   */
  async sweep(gone: (workerId: string) => Promise<boolean>): Promise<number> {
    if (this.system === "-") return 0;
    const root = await this.realPath();
    const verdicts = new Map<string, Promise<boolean>>();
    let removed = 0;
    for (const entry of await readdir(root, { withFileTypes: true })) {
      const owner = entry.isDirectory() ? workspaceOwnerOf(entry.name) : undefined;
      if (!owner || owner.system !== this.system) continue;
      if (!verdicts.has(owner.workerId)) verdicts.set(owner.workerId, gone(owner.workerId));
      if (!(await verdicts.get(owner.workerId))) continue;
      await new LocalWorkspace(join(root, entry.name)).remove();
      removed += 1;
    }
    return removed;
  }

  /** The folder's real path (made if missing): what workspaces' paths begin with. */
  realPath(): Promise<string> {
    this.real ??= mkdir(this.path, { recursive: true }).then(() => realpath(this.path));
    return this.real;
  }
}

/**
 * A private folder on this machine holding a job's workspace: the host sandbox runs commands in
 * it; the Docker sandbox stages files in it and copies them in and out of its container.
 * Paths are workspace-relative and may not leave it, through `..` or any symlink.
 */
export class LocalWorkspace {
  private removed: Promise<void> | undefined;

  /** `dir`: a folder just made for it, by its real path ({@link WorkspaceRoot.create}). */
  constructor(readonly dir: string) {}

  async mkdir(path: string): Promise<void> {
    await workspaceDir(this.dir, this.segments(path), path, true);
  }

  /** `executable`: the file gets mode 0755 (else what it had, or 0644 when new). */
  async writeFile(path: string, data: Uint8Array | ReadableStream<Uint8Array>, executable = false): Promise<void> {
    const segments = this.segments(path);
    const dir = await workspaceDir(this.dir, segments.slice(0, -1), path, true);
    const file = await openNoFollow(join(dir ?? this.dir, segments.at(-1) ?? ""), WRITE_FLAGS, path);
    try {
      // writeFile on a handle writes at the current position: chunks land one after another.
      if (data instanceof Uint8Array) await file.writeFile(data);
      else for await (const chunk of data) await file.writeFile(chunk);
      if (executable) await file.chmod(0o755);
    } finally {
      await file.close();
    }
  }

  async readFile(path: string): Promise<ReadableStream<Uint8Array> | null> {
    const segments = this.segments(path);
    const dir = await workspaceDir(this.dir, segments.slice(0, -1), path, false);
    if (dir === null) return null;
    const file = await openNoFollow(join(dir, segments.at(-1) ?? ""), READ_FLAGS, path).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return null;
      throw err;
    });
    if (!file) return null;
    if (!(await file.stat()).isFile()) {
      await file.close();
      return null;
    }
    return Readable.toWeb(file.createReadStream()) as ReadableStream<Uint8Array>;
  }

  async listFiles(): Promise<WorkspaceFile[]> {
    const files: WorkspaceFile[] = [];
    const walk = async (dir: string, prefix: string): Promise<void> => {
      for (const entry of await readdir(dir, { withFileTypes: true })) {
        const path = prefix + entry.name;
        if (entry.isDirectory()) await walk(join(dir, entry.name), `${path}/`);
        else if (entry.isFile()) files.push({ path, size: (await lstat(join(dir, entry.name))).size });
      }
    };
    await walk(this.dir, "");
    return files;
  }

  /** Removes a file or a folder (with what it holds) in the workspace; a symlink itself, never its target. False when there was none. */
  async removePath(path: string): Promise<boolean> {
    const segments = this.segments(path);
    const dir = await workspaceDir(this.dir, segments.slice(0, -1), path, false);
    if (dir === null) return false;
    const target = join(dir, segments.at(-1) ?? "");
    if (!(await lstat(target).catch(() => null))) return false;
    await rm(target, { recursive: true, force: true });
    return true;
  }

  /**
   * Removes the folder and everything in it, also folders an agent running as this user made
   * unreadable (`chmod 000`). Safe to call twice.
   */
  remove(): Promise<void> {
    this.removed ??= rm(this.dir, { recursive: true, force: true }).catch(async (err: NodeJS.ErrnoException) => {
      // Folders nested past the length of a path (an agent's `mkdir` in a loop): Node cannot name
      // them, GNU rm walks them by descriptor.
      if (err.code === "ENAMETOOLONG") return removeDeep(this.dir);
      if (err.code !== "EACCES" && err.code !== "EPERM") throw err;
      await openUp(this.dir);
      await rm(this.dir, { recursive: true, force: true });
    });
    return this.removed;
  }

  private segments(path: string): string[] {
    if (this.removed) throw new BoxcarError(ErrorCode.sandboxFailed, `workspace ${this.dir} is removed`);
    return workspaceSegments(path);
  }
}

/**
 * The file side of a sandbox whose workspace lives (or is staged) in a {@link LocalWorkspace} on
 * this machine: the host sandbox works in it directly, the Docker sandbox copies it in and out.
 */
export abstract class LocalFilesSandbox {
  constructor(protected files: LocalWorkspace) {}

  mkdir(path: string): Promise<void> {
    return this.files.mkdir(path);
  }

  writeFile(path: string, data: Uint8Array | ReadableStream<Uint8Array>): Promise<void> {
    return this.files.writeFile(path, data);
  }

  readFile(path: string): Promise<ReadableStream<Uint8Array> | null> {
    return this.files.readFile(path);
  }

  listFiles(): Promise<WorkspaceFile[]> {
    return this.files.listFiles();
  }
}

/**
 * A session's files in a workspace on this machine (a host session's). Its commands run as the
 * worker's own user, so nothing here guards against them racing a path (a host session is only
 * an admin's; docs/sessions.md).
 */
export class LocalSessionFiles implements SessionFiles {
  constructor(private readonly files: LocalWorkspace) {}

  async read(path: string, max: number): Promise<Uint8Array | null> {
    const stream = await this.files.readFile(path);
    if (!stream) return null;
    const chunks: Uint8Array[] = [];
    let size = 0;
    for await (const chunk of stream) {
      size += chunk.length;
      if (size > max) throw new BoxcarError(ErrorCode.tooLarge, `${path} has more than ${max} bytes`);
      chunks.push(chunk);
    }
    return Buffer.concat(chunks);
  }

  write(path: string, data: Uint8Array, executable = false): Promise<void> {
    return this.files.writeFile(path, data, executable);
  }

  async list(path: string | undefined, limit: number): Promise<{ files: WorkspaceFile[]; truncated: boolean }> {
    const under = path === undefined ? "" : `${workspaceSegments(path).join("/")}/`;
    if (path !== undefined && (await workspaceDir(this.files.dir, workspaceSegments(path), path, false)) === null) {
      throw new BoxcarError(ErrorCode.notFound, `no folder ${path} in the workspace`);
    }
    const files = (await this.files.listFiles()).filter((f) => f.path.startsWith(under)).sort((a, b) => (a.path < b.path ? -1 : 1));
    return { files: files.slice(0, limit), truncated: files.length > limit };
  }

  remove(path: string): Promise<boolean> {
    return this.files.removePath(path);
  }
}

/** Removes a folder however deep it goes, with the system's `rm` (never leaving its file system). */
function removeDeep(dir: string): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile("rm", ["-rf", "--one-file-system", "--", dir], (err, _stdout, stderr) =>
      err ? reject(new Error(`could not remove ${dir}: ${stderr.trim() || err.message}`)) : resolve(),
    );
  });
}

/** Opens without following a symlink in the last segment; a symlink there is an escape attempt. */
async function openNoFollow(target: string, flags: number, path: string): Promise<FileHandle> {
  try {
    return await open(target, flags, 0o644);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ELOOP") throw escapeError(path);
    throw err;
  }
}

/** Makes every folder under `dir` (never through a symlink) this user's to list and empty. */
async function openUp(dir: string): Promise<void> {
  await chmod(dir, 0o700);
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    if (entry.isDirectory()) await openUp(join(dir, entry.name));
  }
}
