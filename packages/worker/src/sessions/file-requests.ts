/**
 * The file requests a dispatcher makes of a session (`read`, `write`, `list`, `remove`): each
 * parsed, bounded, done on the session's workspace through `withFiles` (which finds the session
 * and restarts its idle clock after), and answered. The session host answers them with its other
 * operations.
 */

import {
  BoxcarError,
  ErrorCode,
  ListSessionFiles,
  MAX_SESSION_FILE_BYTES,
  parseWith,
  SessionFileRef,
  WriteSessionFile,
} from "@boxcar/protocol";
import type { SessionFiles } from "../workspace/files.js";

/** Runs `use` on the files of session `id`. */
export type WithFiles = <T>(id: string, use: (files: SessionFiles) => Promise<T>) => Promise<T>;

/** The file operations, by the last token of the subject. */
export function fileRequests(withFiles: WithFiles): Readonly<Record<string, (body: unknown) => Promise<unknown>>> {
  return {
    read: async (body) => {
      const { id, path } = parseWith(SessionFileRef, body, "request");
      const data = await withFiles(id, (files) => files.read(path, MAX_SESSION_FILE_BYTES));
      if (!data) throw new BoxcarError(ErrorCode.notFound, `no file ${path} in session ${id}`);
      return { path, size: data.length, data: Buffer.from(data).toString("base64") };
    },
    write: async (body) => {
      const { id, path, data, executable } = parseWith(WriteSessionFile, body, "request");
      const bytes = Buffer.from(data, "base64");
      await withFiles(id, (files) => files.write(path, bytes, executable));
      return { path, size: bytes.length };
    },
    list: async (body) => {
      const { id, path, limit } = parseWith(ListSessionFiles, body, "request");
      return withFiles(id, (files) => files.list(path, limit));
    },
    remove: async (body) => {
      const { id, path } = parseWith(SessionFileRef, body, "request");
      return { path, removed: await withFiles(id, (files) => files.remove(path)) };
    },
  };
}
