/**
 * A file of a container's workspace read or written through the engine's archive API: for a
 * workspace copied into the container (not bind-mounted), while the agent runs in it.
 */

import { PassThrough, Readable } from "node:stream";
import type Docker from "dockerode";
import tar from "tar-stream";
import type { ArchiveOwner } from "../../workspace/workspace-archive.js";
import { CONTAINER_WORKSPACE } from "./container-config.js";
import { statusOf } from "./engine.js";

/** A file of a container's, as a stream (null when there is none, or it is no file). */
export async function readInContainer(container: Docker.Container, path: string): Promise<ReadableStream<Uint8Array> | null> {
  let archive: NodeJS.ReadableStream;
  try {
    archive = await container.getArchive({ path });
  } catch (err) {
    if (statusOf(err) === 404) return null;
    throw err;
  }
  const extract = tar.extract();
  const file = new PassThrough();
  let found = false;
  extract.on("entry", (header, entry, next) => {
    entry.on("end", next);
    if (found || header.type !== "file") return entry.resume();
    found = true;
    entry.pipe(file);
  });
  extract.on("finish", () => file.end());
  extract.on("error", (err) => file.destroy(err));
  // A reader that stops early (past its limit) stops the archive too.
  file.on("close", () => (archive as NodeJS.ReadableStream & { destroy?: () => void }).destroy?.());
  archive.pipe(extract);
  const head = await new Promise<boolean>((resolve) => {
    extract.once("entry", (header) => resolve(header.type === "file"));
    extract.once("finish", () => resolve(false));
    extract.once("error", () => resolve(true));
  });
  return head ? (Readable.toWeb(file) as ReadableStream<Uint8Array>) : null;
}

/** Writes a file into a container's workspace (its folders made), owned by the agent's user. */
export async function writeInContainer(
  container: Docker.Container,
  path: string,
  data: Uint8Array | ReadableStream<Uint8Array>,
  owner: ArchiveOwner,
): Promise<void> {
  const body = data instanceof Uint8Array ? data : new Uint8Array(await new Response(data).arrayBuffer());
  const pack = tar.pack();
  const parts = path.split("/");
  for (let i = 1; i < parts.length; i++) {
    pack.entry({ name: `${parts.slice(0, i).join("/")}/`, type: "directory", mode: 0o755, uid: owner.uid, gid: owner.gid });
  }
  pack.entry({ name: path, type: "file", mode: 0o644, uid: owner.uid, gid: owner.gid }, Buffer.from(body));
  pack.finalize();
  await container.putArchive(pack, { path: CONTAINER_WORKSPACE });
}
