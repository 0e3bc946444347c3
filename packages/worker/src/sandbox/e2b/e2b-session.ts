import { randomBytes } from "node:crypto";
import { mkdtemp, realpath } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { CommandExitError, type Sandbox as E2BRemoteSandbox, FileNotFoundError, InvalidArgumentError } from "e2b";
import type { SessionFiles, WorkspaceFile } from "../../workspace/files.js";
import { LocalWorkspace } from "../../workspace/local-workspace.js";
import { packFolder } from "../../workspace/workspace-archive.js";
import { workspaceSegments } from "../../workspace/workspace-path.js";
import type { ExecOptions, ExecResult, JobFiles, Sandbox, SessionSandbox } from "../sandbox.js";
import { listBounded } from "../session-job-sandbox.js";
import { shellQuote } from "../shell-word.js";
import { e2bError, firstLine } from "./e2b-errors.js";

/** How long Boxcar's own commands in a session's sandbox (packing or unpacking a workspace, a chmod) may take. */
const OWN_COMMAND_MS = 300_000;
/** The most of a listing's paths a `files.list` answer carries, as a Docker session's helper. */
const MAX_LISTING_BYTES = 384 * 1024;
/** What a listing's own output starts with, after whatever the sandbox's login shell printed. */
const LISTING_MARK = "BOXCAR-FILES";

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

  /**
   * A job in the session moves its files as an E2B job does, streamed through the file API
   * whatever their size, and looks for its outputs as the session lists its files (bounded).
   */
  get jobFiles(): JobFiles {
    const { sandbox, sessionFiles } = this;
    return {
      mkdir: (path) => sandbox.mkdir(path),
      writeFile: (path, data) => sandbox.writeFile(path, data),
      readFile: (path) => sandbox.readFile(path),
      listFiles: (under) => listBounded(sessionFiles, under),
    };
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
    const archive = archiveName("snapshot");
    const remove = () => ownCommand(this.remote, `rm -f ${inHome(archive)}`, "").catch(() => {});
    let stream: ReadableStream<Uint8Array>;
    try {
      // Exit status 1 is GNU tar's "a file changed as it was read": the archive is whole.
      await ownCommand(
        this.remote,
        `tar -cf ${inHome(archive)} -C ${shellQuote(this.workspace)} .; s=$?; [ $s -le 1 ] || exit $s`,
        "could not pack the session's workspace",
      );
      stream = await this.remote.files.read(archive, { format: "stream" });
    } catch (err) {
      await remove();
      throw e2bError(err, "could not read the session's packed workspace");
    }
    const packed = Readable.fromWeb(stream as never);
    packed.once("close", () => void remove());
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
    const archive = archiveName("seed");
    try {
      await remote.files.write(archive, Readable.toWeb(packFolder(staged.dir, { uid: 0, gid: 0 })) as ReadableStream<Uint8Array>);
    } catch (err) {
      throw e2bError(err, "could not send the session's first files to its E2B sandbox");
    }
    const file = inHome(archive);
    await ownCommand(
      remote,
      `tar -xf ${file} -C ${shellQuote(workspace)} --no-same-owner; s=$?; rm -f ${file}; exit $s`,
      "could not unpack the session's first files",
    );
  } finally {
    await staged.remove();
  }
}

/**
 * A new archive's name, relative: the file API resolves it in the sandbox user's home, as
 * `inHome` does for a command (out of the workspace, which it packs or fills).
 */
function archiveName(what: string): string {
  return `.boxcar-${what}-${randomBytes(8).toString("hex")}.tar`;
}

/** A file of the sandbox user's home, as a command line's word. */
function inHome(name: string): string {
  return `"$HOME"/${shellQuote(name)}`;
}

/**
 * The regular files under `dir` (relative to the workspace; all of it without), by path
 * relative to the workspace: listed in the sandbox by `find`, as its user, following no symlink
 * below `dir`, at most `MAX_LISTING_BYTES` of them (`truncated` past that); null when `dir` is
 * no folder (or is itself a symlink; one on its way is followed, within the sandbox).
 */
async function listInSandbox(
  remote: E2BRemoteSandbox,
  workspace: string,
  dir: string | undefined,
): Promise<{ files: WorkspaceFile[]; truncated: boolean } | null> {
  const q = shellQuote(dir === undefined ? workspace : `${workspace}/${dir}`);
  // What the login shell's profile prints comes before the mark; `find` failing (or missing its
  // -printf, as busybox's) is an error, not an empty folder; 141 is `find` told to stop by `head`.
  const line =
    `[ -d ${q} ] && [ ! -L ${q} ] && cd ${q} || exit 3; printf '${LISTING_MARK}\\0'; ` +
    `find -P . -mindepth 1 -type f -printf '%s %P\\0' | head -c ${MAX_LISTING_BYTES + 1}; ` +
    `s=\${PIPESTATUS[0]}; [ $s -eq 0 ] || [ $s -eq 141 ] || exit 4`;
  let stdout: string;
  try {
    stdout = (await remote.commands.run(line, { timeoutMs: OWN_COMMAND_MS })).stdout;
  } catch (err) {
    if (err instanceof CommandExitError && err.exitCode === 3) return null;
    if (err instanceof CommandExitError && err.exitCode === 4) {
      throw new BoxcarError(
        ErrorCode.sandboxFailed,
        `could not list the workspace: find failed (${firstLine(err.stderr || "no reason given")}); the template needs GNU find`,
      );
    }
    throw e2bError(err, "could not list the workspace");
  }
  const mark = stdout.indexOf(`${LISTING_MARK}\0`);
  if (mark === -1) throw new BoxcarError(ErrorCode.sandboxFailed, "could not list the workspace: its listing came without its mark");
  const listing = stdout.slice(mark + LISTING_MARK.length + 1);
  const truncated = Buffer.byteLength(listing) > MAX_LISTING_BYTES;
  const entries = listing.split("\0");
  // The last is empty after the final NUL, or a part of an entry `head` cut.
  entries.pop();
  const prefix = dir === undefined ? "" : `${dir}/`;
  const files: WorkspaceFile[] = [];
  for (const entry of entries) {
    const space = entry.indexOf(" ");
    const size = Number(entry.slice(0, space));
    if (space > 0 && Number.isSafeInteger(size)) files.push({ path: `${prefix}${entry.slice(space + 1)}`, size });
  }
  return { files, truncated };
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
    // A symlink is no regular file here: E2B gives it its target's type, and its own size.
    const info = await this.info(path);
    if (info?.type !== "file" || info.symlinkTarget !== undefined) return null;
    if (info.size > max) throw new BoxcarError(ErrorCode.tooLarge, `${path} has ${info.size} bytes, more than ${max}`);
    let stream: ReadableStream<Uint8Array>;
    try {
      stream = await this.remote.files.read(this.at(path), { format: "stream" });
    } catch (err) {
      if (err instanceof FileNotFoundError) return null;
      throw e2bError(err, `could not read ${path}`);
    }
    // Read no more than `max` (it may have grown since): what comes past it is refused, not kept.
    const chunks: Uint8Array[] = [];
    let size = 0;
    for await (const chunk of stream) {
      size += chunk.length;
      if (size > max) {
        await stream.cancel().catch(() => {});
        throw new BoxcarError(ErrorCode.tooLarge, `${path} has more than ${max} bytes`);
      }
      chunks.push(chunk);
    }
    return Buffer.concat(chunks, size);
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
    const dir = path === undefined ? undefined : workspaceSegments(path).join("/") || undefined;
    const listed = await listInSandbox(this.remote, this.workspace, dir);
    if (!listed) throw new BoxcarError(ErrorCode.notFound, `no folder ${path} in the workspace`);
    const files = listed.files.sort((a, b) => (a.path < b.path ? -1 : 1));
    return { files: files.slice(0, limit), truncated: listed.truncated || files.length > limit };
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
