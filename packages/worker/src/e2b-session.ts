import { randomBytes } from "node:crypto";
import { mkdtemp, realpath } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, posix } from "node:path";
import { Readable } from "node:stream";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { CommandExitError, type Sandbox as E2BRemoteSandbox, FileNotFoundError, InvalidArgumentError } from "e2b";
import { shellQuote } from "./e2b-command.js";
import { e2bError, firstLine } from "./e2b-errors.js";
import { LocalWorkspace } from "./local-workspace.js";
import type { ExecOptions, ExecResult, JobFiles, Sandbox, SessionFiles, SessionSandbox, WorkspaceFile } from "./sandbox.js";
import { packFolder } from "./workspace-archive.js";
import { workspaceSegments } from "./workspace-path.js";

/** How deep a listing of a workspace goes (E2B's ListDir takes a depth). */
const LIST_DEPTH = 4096;
/** How long Boxcar's own commands in a session's sandbox (packing or unpacking a workspace, a chmod) may take. */
const OWN_COMMAND_MS = 300_000;
/** The most of a listing's paths a `files.list` answer carries, as a Docker session's helper. */
const MAX_LISTING_BYTES = 384 * 1024;

/**
 * A session in an E2B sandbox (docs/sessions.md#e2b-sessions): the job sandbox it wraps runs its
 * commands (each with its own environment, `cwd` and `stdin`), and its files are reached through
 * E2B's file API. Nothing of the worker's machine is in the sandbox, so the files need no guard
 * against a command racing a path: what a symlink there reaches is the sandbox's own.
 */
export class E2BSession implements SessionSandbox {
  readonly kind = "e2b";
  readonly sessionFiles: SessionFiles;

  constructor(
    private readonly sandbox: Sandbox,
    private readonly remote: E2BRemoteSandbox,
  ) {
    this.sessionFiles = new E2BSessionFiles(remote, sandbox.workspace);
  }

  get id(): string {
    return this.sandbox.id;
  }

  get workspace(): string {
    return this.sandbox.workspace;
  }

  get agentPath(): string | undefined {
    return this.sandbox.agentPath;
  }

  get description(): Sandbox["description"] {
    return this.sandbox.description;
  }

  /** A job in the session moves its files as an E2B job does: streamed through the file API, whatever their size. */
  get jobFiles(): JobFiles {
    return this.sandbox;
  }

  exec(argv: string[], opts: ExecOptions): Promise<ExecResult> {
    return this.sandbox.exec(argv, opts);
  }

  destroy(): Promise<void> {
    return this.sandbox.destroy();
  }

  /**
   * A tar of the workspace, made by the sandbox's own `tar` beside it and read back through
   * the file API, then removed. Not held still: a command running meanwhile may change what is
   * read (E2B's pause would hold it, at the cost of a resume).
   */
  async packWorkspace(): Promise<Readable> {
    const archive = besideWorkspace(this.workspace, "snapshot");
    // Exit status 1 is GNU tar's "a file changed as it was read": the archive is whole.
    await ownCommand(
      this.remote,
      `tar -cf ${shellQuote(archive)} -C ${shellQuote(this.workspace)} . 2>/dev/null; [ $? -le 1 ]`,
      "could not pack the session's workspace",
    );
    let stream: ReadableStream<Uint8Array>;
    try {
      stream = await this.remote.files.read(archive, { format: "stream" });
    } catch (err) {
      throw e2bError(err, "could not read the session's packed workspace");
    }
    const packed = Readable.fromWeb(stream as never);
    packed.once("close", () => void ownCommand(this.remote, `rm -f ${shellQuote(archive)}`, "").catch(() => {}));
    return packed;
  }
}

/**
 * Fills a new E2B session's workspace with what `seed` puts in a folder of the worker's (a
 * snapshot's files, a clone, a job's artifacts): staged there, sent as one tar, unpacked by the
 * sandbox's `tar` as the sandbox's user, before anything runs in it.
 */
export async function seedRemote(
  remote: E2BRemoteSandbox,
  workspace: string,
  seed: (files: LocalWorkspace) => Promise<void>,
): Promise<void> {
  const staged = new LocalWorkspace(await realpath(await mkdtemp(join(tmpdir(), "boxcar-e2b-seed-"))));
  try {
    await seed(staged);
    const archive = besideWorkspace(workspace, "seed");
    try {
      await remote.files.write(archive, Readable.toWeb(packFolder(staged.dir, { uid: 0, gid: 0 })) as ReadableStream<Uint8Array>);
    } catch (err) {
      throw e2bError(err, "could not send the session's first files to its E2B sandbox");
    }
    const [file, into] = [shellQuote(archive), shellQuote(workspace)];
    await ownCommand(remote, `tar -xf ${file} -C ${into} --no-same-owner && rm -f ${file}`, "could not unpack the session's first files");
  } finally {
    await staged.remove();
  }
}

/** A new file's path in the folder that holds the workspace (the sandbox user's home), out of the workspace: for an archive of it. */
function besideWorkspace(workspace: string, what: string): string {
  return `${posix.dirname(workspace)}/.boxcar-${what}-${randomBytes(8).toString("hex")}.tar`;
}

/** The regular files under `dir` in an E2B sandbox, by path relative to it, never through a symlink. */
export async function listRemoteFiles(remote: E2BRemoteSandbox, dir: string): Promise<WorkspaceFile[]> {
  const entries = await remote.files.list(dir, { depth: LIST_DEPTH });
  if (entries.length === 0) return [];
  // Entries carry absolute paths under the folder's resolved path: the folder of the shortest
  // one (a top-level entry) is that path.
  const shortest = entries.reduce((a, b) => (b.path.length < a.path.length ? b : a));
  const root = `${posix.dirname(shortest.path)}/`;
  return entries
    .filter((e) => e.type === "file" && e.path.startsWith(root))
    .map((e) => ({ path: e.path.slice(root.length), size: e.size }));
}

/** Runs a command of Boxcar's own in the sandbox; one that fails throws, saying `doing`. */
async function ownCommand(remote: E2BRemoteSandbox, line: string, doing: string): Promise<void> {
  try {
    await remote.commands.run(line, { timeoutMs: OWN_COMMAND_MS });
  } catch (err) {
    if (err instanceof CommandExitError) {
      throw new BoxcarError(ErrorCode.sandboxFailed, `${doing}: ${firstLine(err.stderr || `exit status ${err.exitCode}`)}`);
    }
    throw e2bError(err, doing);
  }
}

/** A session's files through E2B's file API. Paths as a sandbox's (relative, no `..`: refused here). */
class E2BSessionFiles implements SessionFiles {
  constructor(
    private readonly remote: E2BRemoteSandbox,
    private readonly workspace: string,
  ) {}

  async read(path: string, max: number): Promise<Uint8Array | null> {
    const info = await this.info(path);
    if (info?.type !== "file") return null;
    if (info.size > max) throw new BoxcarError(ErrorCode.tooLarge, `${path} has ${info.size} bytes, more than ${max}`);
    const data = await this.remote.files.read(this.at(path), { format: "bytes" }).catch((err: unknown) => {
      throw e2bError(err, `could not read ${path}`);
    });
    if (data.length > max) throw new BoxcarError(ErrorCode.tooLarge, `${path} has more than ${max} bytes`);
    return data;
  }

  async write(path: string, data: Uint8Array, executable = false): Promise<void> {
    const target = this.at(path);
    try {
      await this.remote.files.write(target, new Blob([data]));
    } catch (err) {
      if (err instanceof InvalidArgumentError) throw new BoxcarError(ErrorCode.invalid, `cannot write ${path}: ${firstLine(err)}`);
      throw e2bError(err, `could not write ${path}`);
    }
    if (executable) await ownCommand(this.remote, `chmod 755 ${shellQuote(target)}`, `could not make ${path} executable`);
  }

  async list(path: string | undefined, limit: number): Promise<{ files: WorkspaceFile[]; truncated: boolean }> {
    const under = path === undefined ? [] : workspaceSegments(path);
    let found: WorkspaceFile[];
    try {
      found = await listRemoteFiles(this.remote, [this.workspace, ...under].join("/"));
    } catch (err) {
      // Missing, or not a folder.
      if (err instanceof FileNotFoundError || err instanceof InvalidArgumentError) {
        throw new BoxcarError(ErrorCode.notFound, `no folder ${path} in the workspace`);
      }
      throw e2bError(err, "could not list the workspace");
    }
    const prefix = under.length === 0 ? "" : `${under.join("/")}/`;
    const all = found.map((f) => ({ path: `${prefix}${f.path}`, size: f.size })).sort((a, b) => (a.path < b.path ? -1 : 1));
    const files: WorkspaceFile[] = [];
    let bytes = 0;
    for (const file of all) {
      if (files.length >= limit || bytes >= MAX_LISTING_BYTES) break;
      files.push(file);
      bytes += Buffer.byteLength(file.path) + 32;
    }
    return { files, truncated: files.length < all.length };
  }

  async remove(path: string): Promise<boolean> {
    if (!(await this.info(path))) return false;
    try {
      await this.remote.files.remove(this.at(path));
    } catch (err) {
      throw e2bError(err, `could not remove ${path}`);
    }
    return true;
  }

  /** What is at `path` (a final symlink not followed); null when nothing is. */
  private async info(path: string) {
    try {
      return await this.remote.files.getInfo(this.at(path));
    } catch (err) {
      if (err instanceof FileNotFoundError) return null;
      throw e2bError(err, `could not look at ${path}`);
    }
  }

  private at(path: string): string {
    return [this.workspace, ...workspaceSegments(path)].join("/");
  }
}
