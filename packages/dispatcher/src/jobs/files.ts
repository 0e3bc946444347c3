import { randomBytes, randomUUID } from "node:crypto";
import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import {
  type ArtifactChunk,
  ArtifactRequest,
  BoxcarError,
  ErrorCode,
  type Identity,
  type InputFileRef,
  parseWith,
  toErrorInfo,
  UPLOAD_END_HEADER,
  type UploadReply,
  UploadRequest,
} from "@boxcar/protocol";
import { inputObjectPrefix, mayReplyTo } from "@boxcar/protocol/internal";
import type { Msg, Subscription } from "@nats-io/transport-node";
import { getRecord } from "./jobs.js";

/**
 * Files in and out of the Object Store for callers without JetStream access (see `access.ts`):
 * a job's artifacts one chunk per request, and input files streamed to the dispatcher that
 * opened the upload. Either way the dispatcher checks who may read or write what.
 */

/** One stored chunk of a job's artifact, after sequence `after`. */
export async function artifactChunk(topology: Topology, body: unknown, caller: Identity): Promise<ArtifactChunk> {
  const { id, path, after } = parseWith(ArtifactRequest, body, "request");
  const job = await getRecord(topology, id, caller);
  const artifact = job.artifacts.find((a) => a.path === path);
  if (!artifact) throw new BoxcarError(ErrorCode.notFound, `job ${id} has no artifact ${JSON.stringify(path)}`);
  const info = await topology.artifacts.info(artifact.object);
  if (!info || info.deleted) throw new BoxcarError(ErrorCode.notFound, `artifact ${path} of job ${id} is missing from the Object Store`);
  const bucket = topology.names.buckets.artifacts;
  const chunk =
    info.size === 0
      ? null
      : await topology.jsm.direct.getMessage(`OBJ_${bucket}`, { seq: after + 1, next_by_subj: `$O.${bucket}.C.${info.nuid}` });
  return {
    data: chunk ? Buffer.from(chunk.data).toString("base64") : "",
    size: info.size,
    digest: info.digest,
    last: chunk?.seq ?? after,
    more: chunk !== null,
  };
}

/** How long an upload may wait for its next chunk before it is abandoned. */
const UPLOAD_IDLE_MS = 30_000;
/** How many uploads one user may have open on one dispatcher at a time. */
export const MAX_OPEN_UPLOADS = 8;
/** The largest chunk of an upload (one message), and the largest input file. */
const MAX_CHUNK_BYTES = 128 * 1024;
const MAX_UPLOAD_BYTES = 1024 ** 3;

/**
 * Uploads of input files into `inputs/<owner>/<uuid>/<path>`. An upload's chunks come as
 * requests on a subject only its owner may publish to, carrying an unguessable token; each is
 * answered once the Object Store has taken it, so a client never runs ahead of the store. An
 * upload that stops for `UPLOAD_IDLE_MS`, or whose size does not add up, stores nothing.
 */
export class Uploads {
  private readonly open = new Map<string, number>();

  constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
  ) {}

  start(body: unknown, caller: Identity): UploadReply {
    const { path } = parseWith(UploadRequest, body, "request");
    const open = this.open.get(caller.user) ?? 0;
    if (open >= MAX_OPEN_UPLOADS) {
      throw new BoxcarError(ErrorCode.conflict, `${caller.user} has ${open} uploads open on this dispatcher; finish one first`);
    }
    const object = `${inputObjectPrefix(caller.user)}${randomUUID()}/${path}`;
    const subject = this.topology.names.subjects.upload(caller.user, randomBytes(16).toString("hex"));
    const sub = this.topology.nc.subscribe(subject);
    this.open.set(caller.user, open + 1);
    void receive(this.topology, sub, object, caller, this.log)
      .catch((err) => this.log.warn({ err, object }, "upload abandoned"))
      .finally(() => {
        const left = (this.open.get(caller.user) ?? 1) - 1;
        if (left > 0) this.open.set(caller.user, left);
        else this.open.delete(caller.user);
      });
    return { object, subject };
  }
}

async function receive(topology: Topology, sub: Subscription, object: string, caller: Identity, log: Logger): Promise<void> {
  let received = 0;
  let last: Msg | undefined; // the chunk being stored: it gets the answer when something fails
  let failure: BoxcarError | undefined;
  let idle: NodeJS.Timeout | undefined;
  const stall = () => {
    clearTimeout(idle);
    idle = setTimeout(() => sub.unsubscribe(), UPLOAD_IDLE_MS);
  };
  const fail = (error: BoxcarError) => {
    failure = error;
    throw error;
  };
  // Each chunk is answered when the store asks for the next one: the client waits for that answer.
  async function* chunks(): AsyncGenerator<Uint8Array> {
    for await (const msg of sub) {
      if (!mayReplyTo(topology.names, caller, msg.reply)) continue; // answers go to the uploader's inboxes only
      stall();
      last = msg;
      received += msg.data.length;
      if (msg.data.length > MAX_CHUNK_BYTES)
        fail(new BoxcarError(ErrorCode.tooLarge, `an upload chunk is at most ${MAX_CHUNK_BYTES} bytes, got ${msg.data.length}`));
      if (received > MAX_UPLOAD_BYTES) fail(new BoxcarError(ErrorCode.tooLarge, `an input file is at most ${MAX_UPLOAD_BYTES} bytes`));
      const end = msg.headers?.has(UPLOAD_END_HEADER);
      if (msg.data.length > 0) yield msg.data; // resumes once the store has taken it
      if (end) {
        const declared = Number(msg.headers?.get(UPLOAD_END_HEADER));
        if (declared !== received) fail(new BoxcarError(ErrorCode.invalid, `the upload declared ${declared} bytes and sent ${received}`));
        return;
      }
      msg.respond(JSON.stringify({ ok: true, data: { received } }));
      last = undefined;
    }
    fail(new BoxcarError(ErrorCode.unavailable, `upload stalled for ${UPLOAD_IDLE_MS} ms`));
  }
  stall();
  try {
    const source = chunks();
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const next = await source.next();
        if (next.done) controller.close();
        else controller.enqueue(next.value);
      },
    });
    const info = await topology.artifacts.put({ name: object }, body);
    last?.respond(JSON.stringify({ ok: true, data: { object, size: info.size, digest: info.digest } }));
  } catch (err) {
    // The store's own error (say, from cleaning up) must not hide why the upload failed.
    const error = failure ?? err;
    await topology.artifacts.delete(object).catch((e: unknown) => log.warn({ err: e, object }, "a failed upload's object was not removed"));
    last?.respond(JSON.stringify({ ok: false, error: toErrorInfo(error) }));
    throw error;
  } finally {
    clearTimeout(idle);
    sub.unsubscribe();
  }
}

/**
 * Input files a caller may put in its job: an admin any object, anyone else only its own
 * uploads, so no one can have a job read another's inputs or artifacts.
 */
export function checkInputOwnership(files: readonly InputFileRef[], caller: Identity): void {
  if (caller.role === "admin") return;
  const own = inputObjectPrefix(caller.user);
  const index = files.findIndex((f) => !f.object.startsWith(own));
  if (index >= 0) {
    throw new BoxcarError(ErrorCode.forbidden, `input file ${files[index]?.path}: the object is not one of your uploads`, {
      issues: [{ path: `files[${index}].object`, message: `must be an upload of ${caller.user} (${own}...)` }],
    });
  }
}

/** Removes the caller's own uploads among `files` (a submission that used them was refused). */
export async function discardUploads(topology: Topology, files: readonly InputFileRef[], caller: Identity, log: Logger): Promise<void> {
  const own = inputObjectPrefix(caller.user);
  for (const file of files) {
    if (!file.object.startsWith(own)) continue;
    await topology.artifacts
      .delete(file.object)
      .catch((err: unknown) => log.warn({ err, object: file.object }, "an unused upload was not removed"));
  }
}
