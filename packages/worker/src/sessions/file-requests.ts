/**
 * The file requests a dispatcher makes of a session (`read`, `write`, `stat`, `list`, `remove`):
 * each parsed, bounded, done on the session's workspace through `withSession` (which finds the
 * session and restarts its idle clock after), and answered. A big file moves in parts
 * (docs/sessions.md#big-files): read by ranges, written part after part from offset 0, each part
 * added where the last ended; the copy is checked against the session's quota as it starts, and
 * the file against its SHA-256 once its last part is in. The session host answers them with its
 * other operations.
 */

import {
  BoxcarError,
  ErrorCode,
  ListSessionFiles,
  MAX_SESSION_FILE_BYTES,
  parseWith,
  ReadSessionFile,
  SESSION_FILES_QUOTA,
  SessionFileRef,
  type SessionFileStat,
  StatSessionFile,
  WriteSessionFile,
} from "@boxcar/protocol";
import { workspaceCwd } from "../workspace/workspace-path.js";
import type { HeldSession } from "./held-session.js";
import { type RangedFiles, rangedFilesOf } from "./ranged-files.js";

/** Runs `use` on session `id`. */
export type WithSession = <T>(id: string, use: (held: HeldSession) => Promise<T>) => Promise<T>;

/** The most copies in parts a session remembers as checked against its quota (the oldest is forgotten: checked again if it goes on). */
const MAX_COPIES = 64;

/** The file operations, by the last token of the subject. */
export function fileRequests(withSession: WithSession): Readonly<Record<string, (body: unknown) => Promise<unknown>>> {
  return {
    read: async (body) => {
      const { id, path, offset, length } = parseWith(ReadSessionFile, body, "request");
      if (offset === undefined && length === undefined) {
        const data = await withSession(id, (held) => held.sandbox.sessionFiles.read(path, MAX_SESSION_FILE_BYTES));
        if (!data) throw new BoxcarError(ErrorCode.notFound, `no file ${path} in session ${id}`);
        return { path, size: data.length, data: Buffer.from(data).toString("base64") };
      }
      const from = offset ?? 0;
      const part = await withSession(id, (held) =>
        rangedFilesOf(held, "reading a file by parts").readPart(path, from, length ?? MAX_SESSION_FILE_BYTES),
      );
      if (!part) throw new BoxcarError(ErrorCode.notFound, `no file ${path} in session ${id}`);
      return { path, size: part.data.length, data: Buffer.from(part.data).toString("base64"), offset: from, fileSize: part.size };
    },
    write: async (body) => {
      const request = parseWith(WriteSessionFile, body, "request");
      const bytes = Buffer.from(request.data, "base64");
      return withSession(request.id, (held) => write(held, { ...request, bytes }));
    },
    stat: async (body) => {
      const { id, path, sha256 } = parseWith(StatSessionFile, body, "request");
      return withSession(id, (held) => stat(rangedFilesOf(held, "files.stat"), path, sha256, id));
    },
    list: async (body) => {
      const { id, path, limit } = parseWith(ListSessionFiles, body, "request");
      return withSession(id, (held) => held.sandbox.sessionFiles.list(path, limit));
    },
    remove: async (body) => {
      const { id, path } = parseWith(SessionFileRef, body, "request");
      return { path, removed: await withSession(id, (held) => held.sandbox.sessionFiles.remove(path)) };
    },
  };
}

interface WriteParts {
  id: string;
  path: string;
  bytes: Buffer;
  executable: boolean;
  offset?: number | undefined;
  size?: number | undefined;
  sha256?: string | undefined;
}

/** A whole file, or a part of one (`offset`, `size`); checked against `sha256` once written, when given. */
async function write(
  held: HeldSession,
  { id, path, bytes, executable, offset, size, sha256 }: WriteParts,
): Promise<{ path: string; size: number; fileSize?: number; sha256?: string }> {
  if (offset === undefined || size === undefined) {
    // Checked before anything is written: a session that cannot hash (E2B's) refuses a check it cannot make.
    const files = sha256 === undefined ? undefined : rangedFilesOf(held, "checking a file's sha256");
    await held.sandbox.sessionFiles.write(path, bytes, executable);
    if (files && sha256) await check(files, path, sha256, id);
    return { path, size: bytes.length, ...(sha256 ? { sha256 } : {}) };
  }
  const files = rangedFilesOf(held, "writing a file by parts");
  if (offset + bytes.length > size) {
    throw new BoxcarError(ErrorCode.invalid, `a part of ${path} from ${offset} with ${bytes.length} bytes passes its size, ${size}`);
  }
  const there = await files.sizeOf(path);
  if (offset > 0 && there !== offset) {
    throw new BoxcarError(
      ErrorCode.conflict,
      there === null
        ? `${path} is not in session ${id}: a copy starts at offset 0`
        : `${path} holds ${there} bytes in session ${id}, not ${offset}: resume from ${there}, or start again at 0`,
    );
  }
  // Checked as a copy starts (or goes on with another size): it may not take the workspace past the session's quota.
  if (offset === 0 || held.copies.get(path) !== size) {
    const used = await files.used();
    const after = used - (there ?? 0) + size;
    if (after > SESSION_FILES_QUOTA) {
      throw new BoxcarError(
        ErrorCode.quotaExceeded,
        `${path} (${size} bytes) would take session ${id}'s workspace to ${after} bytes, past its quota of ${SESSION_FILES_QUOTA} (it holds ${used}): remove some files first`,
      );
    }
    held.copies.delete(path);
    held.copies.set(path, size);
    if (held.copies.size > MAX_COPIES) held.copies.delete(held.copies.keys().next().value as string);
  }
  await files.writePart(path, bytes, offset > 0, executable);
  const fileSize = offset + bytes.length;
  if (fileSize === size) held.copies.delete(path);
  if (sha256) await check(files, path, sha256, id);
  return { path, size: bytes.length, fileSize, ...(sha256 ? { sha256 } : {}) };
}

/** The file is the one its sender hashed, or the write is refused, saying what the session has. */
async function check(files: RangedFiles, path: string, sha256: string, id: string): Promise<void> {
  const hashed = await files.hash(path);
  if (!hashed) throw new BoxcarError(ErrorCode.conflict, `${path} is gone from session ${id} before its SHA-256 could be checked`);
  if (hashed.sha256 !== sha256) {
    throw new BoxcarError(
      ErrorCode.conflict,
      `${path} in session ${id} has SHA-256 ${hashed.sha256} (${hashed.size} bytes), not the ${sha256} sent: copy it again from the start`,
    );
  }
}

async function stat(files: RangedFiles, path: string, sha256: boolean, id: string): Promise<SessionFileStat> {
  // `.`: the workspace itself (a path out of it is refused here).
  if (workspaceCwd(path) === undefined) return { path, type: "folder" };
  if (sha256) {
    const hashed = await files.hash(path);
    if (hashed) return { path, type: "file", size: hashed.size, sha256: hashed.sha256, executable: hashed.executable };
  } else {
    const size = await files.sizeOf(path);
    if (size !== null) return { path, type: "file", size };
  }
  if (await files.isFolder(path)) return { path, type: "folder" };
  throw new BoxcarError(ErrorCode.notFound, `no file or folder ${path} in session ${id}`);
}
