import { createReadStream } from "node:fs";
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import tar from "tar-stream";
import type { LocalWorkspace } from "./local-workspace.js";

export interface ArchiveOwner {
  uid: number;
  gid: number;
}

/**
 * A tar stream of a local folder (its folders and regular files, nothing else), every entry
 * owned by `owner`: how a workspace is copied into a container, with no bind mount (so it works
 * the same when the worker itself runs in a container).
 */
export function packFolder(dir: string, owner: ArchiveOwner): Readable {
  const pack = tar.pack();
  const add = async (abs: string, rel: string): Promise<void> => {
    for (const entry of await readdir(abs, { withFileTypes: true })) {
      const path = join(abs, entry.name);
      const name = rel ? `${rel}/${entry.name}` : entry.name;
      if (entry.isDirectory()) {
        pack.entry({ name: `${name}/`, type: "directory", mode: 0o755, ...owner });
        await add(path, name);
      } else if (entry.isFile()) {
        const info = await stat(path);
        const sink = pack.entry({ name, type: "file", size: info.size, mode: info.mode & 0o111 ? 0o755 : 0o644, ...owner });
        await pipeline(createReadStream(path), sink);
      }
    }
  };
  add(dir, "").then(
    () => pack.finalize(),
    (err: unknown) => pack.destroy(err as Error),
  );
  return pack;
}

/** What one copy-out may take: bytes of file data, entries (files and folders), and an abort. */
export interface UnpackLimits {
  maxBytes: number;
  maxEntries: number;
  /** Stops the copy at once (a timeout or cancel of the job): it rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * Unpacks a tar stream of a workspace (a container's, a snapshot) into `files`: folders and
 * regular files only (symlinks, devices and hard links are skipped), every path checked, within
 * `limits`; a file with an execute bit becomes 0755, the others 0644.
 */
export function unpackInto(archive: NodeJS.ReadableStream, files: LocalWorkspace, limits: UnpackLimits): Promise<void> {
  const { maxBytes, maxEntries, signal } = limits;
  const extract = tar.extract();
  let total = 0;
  let entries = 0;
  extract.on("entry", (header, entry, next) => {
    entries += 1;
    if (entries > maxEntries) {
      extract.destroy(
        new BoxcarError(
          ErrorCode.sandboxFailed,
          `the workspace holds more than ${maxEntries} files and folders: too many to copy out of the container`,
        ),
      );
      return;
    }
    // Entries of `getArchive(/workspace/.)` are named `./…`; anything else is checked as it is.
    const name = (header.name === "." || header.name === "./" ? "" : header.name.replace(/^\.\//, "")).replace(/\/$/, "");
    const done = (err?: unknown) => (err ? extract.destroy(err as Error) : next());
    if (name === "" || (header.type !== "file" && header.type !== "directory")) {
      entry.resume();
      entry.once("end", () => done());
    } else if (header.type === "directory") {
      entry.resume();
      files.mkdir(name).then(() => done(), done);
    } else {
      total += header.size ?? 0;
      if (total > maxBytes) {
        done(
          new BoxcarError(
            ErrorCode.sandboxFailed,
            `the workspace holds more than ${maxBytes} bytes: too much to copy out of the container`,
          ),
        );
        return;
      }
      const executable = ((header.mode ?? 0) & 0o111) !== 0;
      files.writeFile(name, Readable.toWeb(entry) as ReadableStream<Uint8Array>, executable).then(() => done(), done);
    }
  });
  return signal ? pipeline(archive, extract, { signal }) : pipeline(archive, extract);
}
