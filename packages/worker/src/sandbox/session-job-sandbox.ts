import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { SessionFiles, WorkspaceFile } from "../workspace/files.js";
import type { JobFiles, Sandbox, SessionSandbox } from "./sandbox.js";

/** A file moves to and from a session's helper in parts of this size: a helper's line holds one in base64 with room to spare. */
const PART_BYTES = 256 * 1024;
/** The most a file read in parts may hold: a workspace's own bound (a helper that says more is refused). */
const MAX_FILE_BYTES = 1024 ** 3;
/** The most files of a session's workspace a job looks for its outputs among: a listing that fits one answer. */
const MAX_LISTED_FILES = 10_000;

/**
 * A session's sandbox as a job's (docs/sessions.md#jobs-in-a-session): the agent runs in it as in
 * a sandbox of its own, its files go through the session's `jobFiles`, and destroying it does
 * nothing: the session keeps it.
 */
export function sessionJobSandbox(session: SessionSandbox): Sandbox {
  const files = session.jobFiles;
  return {
    id: session.id,
    kind: session.kind,
    workspace: session.workspace,
    ...(session.agentPath !== undefined ? { agentPath: session.agentPath } : {}),
    ...(session.description !== undefined ? { description: session.description } : {}),
    exec: (argv, opts) => session.exec(argv, opts),
    mkdir: (path) => files.mkdir(path),
    writeFile: (path, data) => files.writeFile(path, data),
    readFile: (path) => files.readFile(path),
    listFiles: (under) => files.listFiles(under),
    destroy: async () => {},
  };
}

/** A session's files that can also be read from an offset and added to: what moves a file of any size in parts. */
export interface PartFiles extends Pick<SessionFiles, "list"> {
  /** Up to `length` bytes of the file from `offset`, with the file's whole size; null when there is no such regular file. */
  readPart(path: string, offset: number, length: number): Promise<{ data: Uint8Array; size: number } | null>;
  /** Writes a file, making its folders (`append`: added to its end, else replacing it). */
  write(path: string, data: Uint8Array, executable: boolean, append: boolean): Promise<void>;
  mkdir(path: string): Promise<void>;
}

/** A job's files through `files`, moved in parts of `PART_BYTES`, so that no request to it carries more. */
export function filesInParts(files: PartFiles): JobFiles {
  return {
    mkdir: (path) => files.mkdir(path),
    async writeFile(path, data) {
      let written = false;
      for await (const part of inParts(data)) {
        await files.write(path, part, false, written);
        written = true;
      }
      if (!written) await files.write(path, new Uint8Array(0), false, false);
    },
    async readFile(path) {
      const first = await files.readPart(path, 0, PART_BYTES);
      if (!first) return null;
      // Read up to the size it had at first: a file that grows meanwhile does not hold the read for ever.
      const { size } = first;
      if (size > MAX_FILE_BYTES) throw new BoxcarError(ErrorCode.tooLarge, `${path} has ${size} bytes: more than ${MAX_FILE_BYTES}`);
      let offset = first.data.length;
      return new ReadableStream<Uint8Array>({
        start(controller) {
          if (first.data.length > 0) controller.enqueue(first.data);
          if (offset >= size) controller.close();
        },
        async pull(controller) {
          const part = await files.readPart(path, offset, Math.min(PART_BYTES, size - offset));
          if (!part || part.data.length === 0) {
            // Shortened or removed meanwhile: what was read is what there is.
            controller.close();
            return;
          }
          offset += part.data.length;
          controller.enqueue(part.data);
          if (offset >= size) controller.close();
        },
      });
    },
    listFiles: (under) => listBounded(files, under),
  };
}

/**
 * The regular files of a session's workspace under the folders `under` names (all of it
 * without), each listing within what one answer holds; more is refused rather than cut short,
 * so no output is missed unsaid.
 */
export async function listBounded(files: Pick<SessionFiles, "list">, under: readonly string[] | undefined): Promise<WorkspaceFile[]> {
  const found: WorkspaceFile[] = [];
  for (const folder of under ?? [undefined]) {
    const listed = await files.list(folder, MAX_LISTED_FILES).catch((err: unknown) => {
      // An output folder the job did not make holds no outputs.
      if (folder !== undefined && err instanceof BoxcarError && err.code === ErrorCode.notFound) return { files: [], truncated: false };
      throw err;
    });
    if (listed.truncated) {
      throw new BoxcarError(
        ErrorCode.tooLarge,
        `${folder ?? "the session's workspace"} holds more files than one listing carries (${listed.files.length} fit): a job in a session looks for its outputs there; remove some, or narrow its outputs`,
      );
    }
    found.push(...listed.files);
  }
  return found;
}

/** The bytes of `data` in parts of at most `PART_BYTES`. */
async function* inParts(data: Uint8Array | ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const chunks = data instanceof Uint8Array ? [data] : data;
  for await (const chunk of chunks) {
    for (let at = 0; at < chunk.length; at += PART_BYTES) yield chunk.subarray(at, at + PART_BYTES);
  }
}
