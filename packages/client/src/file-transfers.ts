/**
 * Files to and from the system through the dispatchers' API: a local input file uploaded a
 * chunk at a time to the Object Store (`uploadInput`), and a job's artifacts downloaded a chunk
 * at a time under a folder, each checked against its size and digest (`downloadArtifacts`).
 */

import { createHash } from "node:crypto";
import { mkdir, open, rm } from "node:fs/promises";
import { dirname, join, resolve, sep } from "node:path";
import { ApiEndpoint, type Artifact, BoxcarError, ErrorCode, type InputFileRef, UPLOAD_END_HEADER, UploadDone } from "@boxcar/protocol";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { z } from "zod";
import type { DispatcherApi } from "./dispatcher-api.js";

/** The largest chunk of an input file sent in one message (the server's limit is usually 1 MiB). */
const UPLOAD_CHUNK_BYTES = 128 * 1024;

/** Puts a local file in the Object Store and returns the reference a job spec carries. */
export async function uploadInput(api: DispatcherApi, localPath: string, workspacePath: string): Promise<InputFileRef> {
  const file = await open(localPath);
  try {
    const upload = await api.request(ApiEndpoint.inputsUpload, { path: workspacePath });
    const buffer = new Uint8Array(UPLOAD_CHUNK_BYTES);
    let size = 0;
    for (;;) {
      const { bytesRead } = await file.read(buffer, 0, buffer.length, null);
      size += bytesRead;
      if (bytesRead === buffer.length) {
        await api.ask(upload.subject, buffer, z.unknown());
        continue;
      }
      const end = natsHeaders();
      end.set(UPLOAD_END_HEADER, String(size));
      await api.ask(upload.subject, buffer.subarray(0, bytesRead), UploadDone, end);
      return { path: workspacePath, object: upload.object };
    }
  } finally {
    await file.close();
  }
}

/** Downloads the job's artifacts under `dir`; returns the paths written. */
export async function downloadArtifacts(api: DispatcherApi, jobId: string, artifacts: readonly Artifact[], dir: string): Promise<string[]> {
  const root = resolve(dir);
  const written: string[] = [];
  for (const artifact of artifacts) {
    const target = resolve(join(root, artifact.path));
    if (!target.startsWith(root + sep)) throw new BoxcarError(ErrorCode.invalid, `artifact path escapes ${dir}: ${artifact.path}`);
    await mkdir(dirname(target), { recursive: true });
    const file = await open(target, "w");
    try {
      await downloadArtifact(api, jobId, artifact.path, file);
    } catch (err) {
      await file.close();
      await rm(target, { force: true });
      throw err;
    }
    await file.close();
    written.push(target);
  }
  return written;
}

/** Writes one artifact to `file` a chunk at a time, and checks its size and digest. */
async function downloadArtifact(
  api: DispatcherApi,
  jobId: string,
  path: string,
  file: import("node:fs/promises").FileHandle,
): Promise<void> {
  const hash = createHash("sha256");
  let received = 0;
  for (let after = 0; ; ) {
    const chunk = await api.request(ApiEndpoint.jobsArtifact, { id: jobId, path, after });
    const data = Buffer.from(chunk.data, "base64");
    hash.update(data);
    await file.write(data);
    received += data.length;
    after = chunk.last;
    if (received >= chunk.size || !chunk.more) {
      if (received !== chunk.size || !sameDigest(chunk.digest, hash.digest())) {
        throw new BoxcarError(
          ErrorCode.internal,
          `artifact ${path} of job ${jobId} arrived incomplete (${received} of ${chunk.size} bytes)`,
        );
      }
      return;
    }
  }
}

/** Whether an Object Store digest (`SHA-256=` and the hash in base64, URL-safe or not, padded or not) is `sha256`. */
function sameDigest(digest: string, sha256: Buffer): boolean {
  const normal = (b64: string) => b64.replaceAll("-", "+").replaceAll("_", "/").replace(/=+$/, "");
  return digest.startsWith("SHA-256=") && normal(digest.slice(8)) === normal(sha256.toString("base64"));
}
