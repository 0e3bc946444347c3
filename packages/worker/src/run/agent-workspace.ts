import { createHash } from "node:crypto";
import { AgentResultFile, type Artifact, BoxcarError, ErrorCode, type Usage, UsageLine, type WorkItem, zodIssues } from "@boxcar/protocol";
import { addUsage, usageOf } from "@boxcar/protocol/internal";
import type { ObjectStore } from "@nats-io/obj";
import type { Sandbox } from "../sandbox/sandbox.js";
import { AgentPaths, MAX_RESULT_BYTES } from "../workspace/agent-contract.js";
import { globMatcher, globRoots } from "../workspace/glob.js";
import type { Redactor } from "../workspace/redactor.js";

/** The most artifacts one job may keep: their list lives in the job record. */
export const MAX_ARTIFACTS = 1000;

/** Lays out the workspace the agent contract promises: folders, input JSON and input files. */
export async function prepareWorkspace(sandbox: Sandbox, item: WorkItem, store: ObjectStore): Promise<void> {
  await sandbox.mkdir(AgentPaths.tmp);
  await sandbox.mkdir(AgentPaths.output);
  const encode = (value: unknown) => new TextEncoder().encode(JSON.stringify(value));
  await sandbox.writeFile(AgentPaths.input, encode(item.input));
  const { chain } = item;
  await sandbox.writeFile(
    AgentPaths.chain,
    encode(
      chain
        ? { root: chain.root, depth: chain.depth, history: chain.history, run: chain.run, step: chain.step, index: chain.index }
        : { root: item.jobId, depth: 0, history: [] },
    ),
  );
  for (const file of item.files) {
    const object = await store.get(file.object);
    if (!object) {
      throw new BoxcarError(
        ErrorCode.inputFileMissing,
        `input file ${file.path}: no object ${JSON.stringify(file.object)} in the Object Store`,
      );
    }
    await sandbox.writeFile(file.path, object.data);
    const err = await object.error;
    if (err) throw new BoxcarError(ErrorCode.internal, `input file ${file.path} arrived incomplete: ${err.message}`, { cause: err });
  }
}

/** The agent's result file, validated; undefined when the agent wrote none. */
export async function readResultFile(sandbox: Sandbox): Promise<AgentResultFile | undefined> {
  const body = await sandbox.readFile(AgentPaths.result);
  if (!body) return undefined;
  const text = new TextDecoder().decode(await readAtMost(body, MAX_RESULT_BYTES));
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (cause) {
    // The parser's message quotes the file: only where it went wrong is kept (the file is the agent's, and may hold a secret).
    const at = /position (\d+)/.exec((cause as Error).message)?.[1];
    throw new BoxcarError(ErrorCode.badResult, `${AgentPaths.result} is not valid JSON${at === undefined ? "" : ` (at byte ${at})`}`);
  }
  const parsed = AgentResultFile.safeParse(json);
  if (parsed.success) return parsed.data;
  const issues = zodIssues(parsed.error);
  const detail = issues.map((i) => (i.path ? `${i.path}: ${i.message}` : i.message)).join("; ");
  throw new BoxcarError(ErrorCode.badResult, `${AgentPaths.result} is not a valid result: ${detail}`, { issues });
}

/** How each artifact is stored: `put` runs once, or again while the caller waits for room in the store. */
export type KeepArtifact = (what: string, put: () => Promise<void>) => Promise<void>;

/**
 * Streams the workspace files that match `globs` into the Object Store as `<jobId>/<path>`,
 * one by one, each through `keep` (which may put it again), and lists each in `stored` once it
 * is stored whole: an object whose put failed is not listed (the Object Store removes the chunks
 * it stored). Files under `.boxcar/` are never artifacts.
 */
export async function storeArtifacts(
  sandbox: Sandbox,
  jobId: string,
  globs: readonly string[],
  store: ObjectStore,
  redactor: Pick<Redactor, "stream" | "text">,
  opts: { stored?: Artifact[]; keep?: KeepArtifact } = {},
): Promise<Artifact[]> {
  const { stored: artifacts = [], keep = (_what, put) => put() } = opts;
  const matches = globMatcher(globs);
  const files = (await sandbox.listFiles(globRoots(globs)))
    .filter((f) => !f.path.startsWith(`${AgentPaths.reserved}/`) && matches(f.path))
    .sort((a, b) => (a.path < b.path ? -1 : 1));
  if (files.length > MAX_ARTIFACTS) {
    throw new BoxcarError(
      ErrorCode.tooLarge,
      `the agent left ${files.length} files matching its outputs (${globs.join(", ")}); the limit is ${MAX_ARTIFACTS}`,
    );
  }
  for (const { path } of files) {
    const stored = redactor.text(path);
    let object: StoredObject | undefined;
    await keep(`the artifact ${stored}`, async () => {
      object = await storeArtifact(sandbox, path, `${jobId}/${stored}`, store, redactor);
    });
    if (object) artifacts.push({ path: stored, ...object });
  }
  return artifacts;
}

/** An artifact as stored: its object's name, and the size and digest of the bytes stored. */
type StoredObject = Omit<Artifact, "path">;

/** Streams one workspace file, redacted, into the Object Store as `object`; undefined when it is gone since it was listed. */
async function storeArtifact(
  sandbox: Sandbox,
  path: string,
  object: string,
  store: ObjectStore,
  redactor: Pick<Redactor, "stream">,
): Promise<StoredObject | undefined> {
  const body = await sandbox.readFile(path);
  if (!body) return undefined; // removed since it was listed
  const hash = createHash("sha256");
  let size = 0;
  // Stored redacted, as the agent's output is: its size and digest are the stored bytes'.
  const secrets = redactor.stream();
  const keep = (chunk: Uint8Array, controller: TransformStreamDefaultController<Uint8Array>) => {
    hash.update(chunk);
    size += chunk.length;
    if (chunk.length > 0) controller.enqueue(chunk);
  };
  // A put that fails leaves the file unread: the pipe is cut, which closes it.
  const cut = new AbortController();
  const measured = body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform: (chunk, controller) => keep(secrets.push(chunk), controller),
      flush: (controller) => keep(secrets.end(), controller),
    }),
    { signal: cut.signal },
  );
  try {
    await store.put({ name: object }, measured);
  } catch (err) {
    cut.abort();
    throw err;
  }
  return { object, size, sha256: hash.digest("hex") };
}

/** The most of an agent's usage file read: 10 000 lines of 100 bytes. */
const MAX_USAGE_BYTES = 1024 * 1024;

/** One report of a usage file: its lines `from` (the report's id) up to `to`, and what they used. */
interface Batch {
  from: number;
  to: number;
  usage: Usage;
}

/**
 * An attempt's usage file (one JSON object a line, docs/agent-contract.md), read while the agent
 * runs and once more at its end: each read reports the calls appended since the last (`report`,
 * with how many lines were reported before them, which names the report), so that they count,
 * and budgets stop, as they are made. While the agent runs only whole lines are read (the last
 * may be half-written). Lines that are not such objects are left out (a usage report does not
 * fail a job), and so is what lies past the first MiB. A report that fails is sent again as it
 * was (same lines, same id), so that the stream drops it if it was stored after all.
 */
export class UsageFile {
  /** How many of its lines are reported, and what they used. */
  private reported = 0;
  private used: Usage | undefined;
  /** A report that failed: sent again as it was (same lines, same id) before anything newer. */
  private pending: Batch | undefined;
  private reading: Promise<void> | undefined;

  constructor(
    private readonly sandbox: Pick<Sandbox, "readFile">,
    private readonly report: (usage: Usage, from: number) => Promise<void>,
  ) {}

  /** Reports what was appended since the last read (one read at a time: a read under way is waited for, not repeated). */
  async read(): Promise<void> {
    if (!this.reading) this.reading = this.next(false).finally(() => (this.reading = undefined));
    await this.reading;
  }

  /**
   * Reports the rest, once the agent ended; the attempt's whole usage as reported (what a file
   * cut shorter or rewritten meanwhile no longer holds included), or undefined when it reported
   * none. A report that fails is `onError`'s, and counts in the attempt's usage all the same.
   */
  async end(onError: (err: unknown) => void): Promise<Usage | undefined> {
    await this.reading?.catch(() => {});
    const unsent: Batch[] = this.pending ? [this.pending] : [];
    try {
      const fresh = this.fresh(await this.lines(true));
      if (fresh) unsent.push(fresh);
      for (let batch = unsent[0]; batch; batch = unsent[0]) {
        await this.send(batch);
        unsent.shift();
      }
    } catch (err) {
      onError(err);
    }
    return unsent.reduce<Usage | undefined>((total, batch) => (total ? addUsage(total, batch.usage) : batch.usage), this.used);
  }

  private async next(ended: boolean): Promise<void> {
    if (this.pending) await this.send(this.pending);
    const fresh = this.fresh(await this.lines(ended));
    if (fresh) await this.send(fresh);
  }

  /** The lines past those reported, as a report (an agent that cut its file shorter reports nothing until it is longer again). */
  private fresh(lines: UsageLine[]): Batch | undefined {
    const fresh = lines.slice(this.reported);
    return fresh.length > 0 ? { from: this.reported, to: lines.length, usage: usageOf(fresh) } : undefined;
  }

  /** Sends one report; failed, it stays pending (and its lines counted as read). */
  private async send(batch: Batch): Promise<void> {
    this.pending = batch;
    this.reported = batch.to;
    await this.report(batch.usage, batch.from);
    this.pending = undefined;
    this.used = this.used ? addUsage(this.used, batch.usage) : batch.usage;
  }

  private async lines(ended: boolean): Promise<UsageLine[]> {
    const body = await this.sandbox.readFile(AgentPaths.usage);
    if (!body) return [];
    let text = new TextDecoder().decode(await readAtMost(body, MAX_USAGE_BYTES, AgentPaths.usage, true));
    if (!ended) text = text.slice(0, text.lastIndexOf("\n") + 1);
    const lines: UsageLine[] = [];
    for (const line of text.split("\n")) {
      if (line.trim() === "") continue;
      try {
        const parsed = UsageLine.safeParse(JSON.parse(line));
        if (parsed.success) lines.push(parsed.data);
      } catch {
        // not JSON: left out
      }
    }
    return lines;
  }
}

/** A file's first `limit` bytes: past them, an error (`bad_result`), or with `truncate` the bytes up to the last whole line. */
async function readAtMost(
  body: ReadableStream<Uint8Array>,
  limit: number,
  path: string = AgentPaths.result,
  truncate = false,
): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    if (size > limit && truncate) {
      const kept = Buffer.concat([...chunks, chunk]).subarray(0, limit);
      return kept.subarray(0, kept.lastIndexOf(10) + 1);
    }
    if (size > limit) throw new BoxcarError(ErrorCode.badResult, `${path} is larger than ${limit} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size);
}
