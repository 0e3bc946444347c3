/**
 * Files and folders copied into and out of a session in parts (docs/sessions.md#big-files):
 * `copyToSession` writes a local file part after part (512 KiB each), its SHA-256 sent with the
 * last, which the session checks; `copyFromSession` reads one by ranges into `<file>.boxcar-part`,
 * checks it against the SHA-256 the session gave as it started, and only then names it. Both
 * resume: a copy in goes on from what the session holds when that is the start of the file (by
 * its hash), a copy out from the part file already here. A folder is its regular files, each
 * copied so, at their paths under the destination.
 */

import { createHash } from "node:crypto";
import { type Dirent, constants as fsConstants } from "node:fs";
import { chmod, type FileHandle, mkdir, open, readdir, rename, rm, stat } from "node:fs/promises";
import { basename, dirname, join, relative, resolve, sep } from "node:path";
import { ApiEndpoint, BoxcarError, ErrorCode, MAX_SESSION_FILE_BYTES, SESSION_FILES_QUOTA, type SessionFileStat } from "@boxcar/protocol";
import type { DispatcherApi } from "./dispatcher-api.js";

/** How long a request that has the session hash a file may take (up to a workspace's 1 GiB read there). */
export const HASHING_WAIT_MS = 160_000;
/** The most files a folder copied out of a session may hold (one listing). */
const MAX_FOLDER_FILES = 10_000;

export interface CopyOptions {
  /** Stops the copy between two parts (a later copy of the same file resumes it). */
  signal?: AbortSignal;
  /** Called after each part: the file (its path in the session), the bytes of it in place, its size. */
  onProgress?(progress: { path: string; done: number; size: number }): void;
}

/** A file copied: its path in the session and here, its size and SHA-256, and where the copy started (0, or what was there already). */
export interface CopiedFile {
  path: string;
  local: string;
  size: number;
  sha256: string;
  resumedFrom: number;
}

/** Copies a local file or folder into session `id` at `path` (a folder's files under it; a file into a folder there, by its name). */
export async function copyToSession(
  api: DispatcherApi,
  id: string,
  local: string,
  path: string,
  opts: CopyOptions = {},
): Promise<CopiedFile[]> {
  const what = await stat(local).catch(() => undefined);
  if (!what) throw new BoxcarError(ErrorCode.notFound, `no file or folder ${local} here`);
  if (what.isDirectory()) {
    const copied: CopiedFile[] = [];
    for (const file of await localFiles(local)) copied.push(await uploadFile(api, id, join(local, file), joinPath(path, file), opts));
    return copied;
  }
  // A file into a folder of the session: by its name there.
  const there = await statIn(api, id, path, false);
  const target = path.endsWith("/") || there?.type === "folder" ? joinPath(path, basename(local)) : path;
  return [await uploadFile(api, id, local, target, opts)];
}

/** Copies a file or folder of session `id` here (a folder's files under `local`; a file into a folder here, by its name). */
export async function copyFromSession(
  api: DispatcherApi,
  id: string,
  path: string,
  local: string,
  opts: CopyOptions = {},
): Promise<CopiedFile[]> {
  const there = await statIn(api, id, path, false);
  if (!there) throw new BoxcarError(ErrorCode.notFound, `no file or folder ${path} in session ${id}`);
  if (there.type === "file") {
    const here = await stat(local).catch(() => undefined);
    const target = local.endsWith(sep) || here?.isDirectory() ? join(local, basename(path)) : local;
    return [await downloadFile(api, id, path, target, opts)];
  }
  const whole = path === "." || path === "./" || path === "";
  const listed = await api.request(ApiEndpoint.sessionsFilesList, { id, ...(whole ? {} : { path }), limit: MAX_FOLDER_FILES });
  if (listed.truncated) {
    throw new BoxcarError(ErrorCode.tooLarge, `${path} holds more than ${MAX_FOLDER_FILES} files: copy its folders one by one`);
  }
  const root = resolve(local);
  const prefix = whole ? "" : `${path.replace(/\/+$/, "")}/`;
  const copied: CopiedFile[] = [];
  for (const file of listed.files) {
    const target = resolve(root, file.path.slice(prefix.length));
    if (!target.startsWith(root + sep)) throw new BoxcarError(ErrorCode.invalid, `a file of the session leaves ${local}: ${file.path}`);
    copied.push(await downloadFile(api, id, file.path, target, opts));
  }
  return copied;
}

/** What `path` is in the session; undefined when nothing is there. */
export async function statIn(api: DispatcherApi, id: string, path: string, sha256: boolean): Promise<SessionFileStat | undefined> {
  try {
    return await api.request(ApiEndpoint.sessionsFilesStat, { id, path, sha256 }, sha256 ? HASHING_WAIT_MS : api.timeoutMs);
  } catch (err) {
    if (err instanceof BoxcarError && err.code === ErrorCode.notFound) return undefined;
    throw err;
  }
}

/** One file into the session, from where it stands there if that is the start of this one. */
async function uploadFile(api: DispatcherApi, id: string, local: string, path: string, opts: CopyOptions): Promise<CopiedFile> {
  const file = await open(local, fsConstants.O_RDONLY);
  try {
    const { size, mode } = await file.stat();
    if (size > SESSION_FILES_QUOTA) {
      throw new BoxcarError(ErrorCode.quotaExceeded, `${local} has ${size} bytes: more than a session's quota of ${SESSION_FILES_QUOTA}`);
    }
    const executable = (mode & 0o111) !== 0;
    const sha256 = await hashOf(file, size);
    let start = 0;
    const there = await statIn(api, id, path, false);
    if (there?.type === "folder") throw new BoxcarError(ErrorCode.invalid, `${path} is a folder in session ${id}`);
    if (there?.type === "file" && there.size !== undefined && there.size > 0 && there.size <= size) {
      const hashed = await statIn(api, id, path, true);
      if (hashed?.size !== undefined && hashed.size <= size && hashed.sha256 === (await hashOf(file, hashed.size))) start = hashed.size;
    }
    // Whole already (its mode aside: an executable one is written again, which sets it).
    if (start === size && size > 0 && !executable) return { path, local, size, sha256, resumedFrom: start };
    if (start === size) start = 0;
    const buffer = Buffer.alloc(MAX_SESSION_FILE_BYTES);
    for (let at = start; ; ) {
      opts.signal?.throwIfAborted();
      const { bytesRead } = await file.read(buffer, 0, Math.min(buffer.length, size - at), at);
      const last = at + bytesRead >= size;
      const body = {
        id,
        path,
        data: buffer.subarray(0, bytesRead).toString("base64"),
        offset: at,
        size,
        ...(executable ? { executable } : {}),
        ...(last ? { sha256 } : {}),
      };
      await api.request(ApiEndpoint.sessionsFilesWrite, body, last ? HASHING_WAIT_MS : api.timeoutMs);
      at += bytesRead;
      opts.onProgress?.({ path, done: at, size });
      if (last) break;
      if (bytesRead === 0) throw new BoxcarError(ErrorCode.conflict, `${local} shrank while it was copied`);
    }
    return { path, local, size, sha256, resumedFrom: start };
  } finally {
    await file.close();
  }
}

/** One file out of the session, into `<local>.boxcar-part` (resumed from what it holds), named `local` once its SHA-256 is the session's. */
async function downloadFile(api: DispatcherApi, id: string, path: string, local: string, opts: CopyOptions): Promise<CopiedFile> {
  const there = await statIn(api, id, path, true);
  if (there?.type !== "file" || there.size === undefined || there.sha256 === undefined) {
    throw new BoxcarError(ErrorCode.notFound, `no file ${path} in session ${id}`);
  }
  const { size, sha256 } = there;
  await mkdir(dirname(local), { recursive: true });
  const partPath = `${local}.boxcar-part`;
  const part = await open(partPath, "a+");
  let at: number;
  let start: number;
  try {
    start = (await part.stat()).size;
    if (start > size) {
      await part.truncate(0);
      start = 0;
    }
    // What is here already is hashed again: the whole is checked at the end.
    const hash = createHash("sha256");
    if (start > 0)
      for await (const chunk of part.createReadStream({ start: 0, end: start - 1, autoClose: false })) hash.update(chunk as Buffer);
    for (at = start; at < size; ) {
      opts.signal?.throwIfAborted();
      const got = await api.request(ApiEndpoint.sessionsFilesRead, {
        id,
        path,
        offset: at,
        length: Math.min(MAX_SESSION_FILE_BYTES, size - at),
      });
      const data = Buffer.from(got.data, "base64");
      if (data.length === 0) break;
      await part.write(data);
      hash.update(data);
      at += data.length;
      opts.onProgress?.({ path, done: at, size });
    }
    if (at !== size || hash.digest("hex") !== sha256) {
      await part.close().catch(() => {});
      await rm(partPath, { force: true });
      throw new BoxcarError(ErrorCode.conflict, `${path} changed in session ${id} while it was copied: copy it again`);
    }
  } finally {
    await part.close().catch(() => {});
  }
  await rename(partPath, local);
  if (there.executable) await chmod(local, 0o755);
  return { path, local, size, sha256, resumedFrom: start };
}

/** The SHA-256 (hex) of the first `length` bytes of `file`. */
async function hashOf(file: FileHandle, length: number): Promise<string> {
  const hash = createHash("sha256");
  if (length > 0) {
    for await (const chunk of file.createReadStream({ start: 0, end: length - 1, autoClose: false })) hash.update(chunk as Buffer);
  }
  return hash.digest("hex");
}

/** The regular files under a local folder, `/`-separated and sorted (links are not followed, nor copied). */
async function localFiles(dir: string): Promise<string[]> {
  const entries = (await readdir(dir, { recursive: true, withFileTypes: true })) as Dirent[];
  return entries
    .filter((e) => e.isFile())
    .map((e) => relative(dir, join(e.parentPath, e.name)).split(sep).join("/"))
    .sort();
}

/** A path of the session's under a folder (`.` or nothing: the workspace). */
function joinPath(folder: string, name: string): string {
  const base = folder.replace(/\/+$/, "");
  return base === "" || base === "." ? name : `${base}/${name}`;
}
