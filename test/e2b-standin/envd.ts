import { spawn } from "node:child_process";
import { createReadStream, createWriteStream, type Stats } from "node:fs";
import { lstat, mkdir, readdir, readlink, realpath, rm, stat } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { userInfo } from "node:os";
import { basename, dirname, join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";
import { ConnectError, ResponseStream, readStreamRequest, readUnaryRequest, sendUnary, sendUnaryError } from "./connect.js";
import type { StandInSandbox } from "./sandbox.js";

/** The port E2B's SDK names in `E2b-Sandbox-Port` for the sandbox daemon (envd). */
export const ENVD_PORT = 49983;

const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/**
 * The sandbox daemon's HTTP side, for every sandbox at one URL (like `E2B_SANDBOX_URL`): the
 * sandbox is named by the `E2b-Sandbox-Id` header, access by `X-Access-Token`. Implements the
 * calls the SDK makes for `commands.run` and `files.read/write/list/makeDir/getInfo`.
 */
export function createEnvdHandler(find: (id: string) => StandInSandbox | undefined) {
  return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = new URL(req.url ?? "/", "http://envd");
    const id = String(req.headers["e2b-sandbox-id"] ?? "");
    const sandbox = find(id);
    // E2B's proxy answers 502 for a sandbox that is not running; the SDK reads that as "gone".
    if (sandbox?.state !== "running" || req.headers["e2b-sandbox-port"] !== String(ENVD_PORT)) {
      return httpError(res, 502, `sandbox ${JSON.stringify(id)} not found`);
    }
    if (req.method === "GET" && url.pathname === "/health") {
      res.writeHead(204).end();
      return;
    }
    const rpc = url.pathname.startsWith("/process.Process/") || url.pathname.startsWith("/filesystem.Filesystem/");
    if (req.headers["x-access-token"] !== sandbox.envdAccessToken) {
      const message = "unauthorized access, please provide a valid access token";
      return rpc ? sendUnaryError(res, new ConnectError("unauthenticated", message)) : httpError(res, 401, message);
    }
    // A killed sandbox's connections just drop, as when its VM goes away.
    const drop = () => res.socket?.destroy();
    sandbox.onKill.add(drop);
    res.once("close", () => sandbox.onKill.delete(drop));

    if (url.pathname === "/process.Process/Start" && req.method === "POST") return startProcess(sandbox, req, res);
    try {
      if (rpc && req.method === "POST") {
        const handler = UNARY[url.pathname];
        if (!handler) throw new ConnectError("unimplemented", `the stand-in does not implement ${url.pathname}`);
        return sendUnary(res, await handler(sandbox, await readUnaryRequest(req)));
      }
      if (url.pathname === "/files" && req.method === "GET") return await download(sandbox, url, req, res);
      if (url.pathname === "/files" && req.method === "POST") return await upload(sandbox, url, req, res);
      return httpError(res, 404, `the stand-in does not implement ${req.method} ${url.pathname}`);
    } catch (err) {
      if (res.headersSent) return void res.destroy();
      if (err instanceof HttpError) return httpError(res, err.status, err.message);
      const connectError = err instanceof ConnectError ? err : new ConnectError("internal", (err as Error).message);
      return rpc ? sendUnaryError(res, connectError) : httpError(res, 500, connectError.message);
    }
  };
}

type UnaryHandler = (sandbox: StandInSandbox, message: Record<string, unknown>) => Promise<object>;

const UNARY: Record<string, UnaryHandler> = {
  "/filesystem.Filesystem/MakeDir": async (sandbox, { path }) => {
    const dir = sandbox.resolvePath(String(path ?? ""));
    const existing = await stat(dir).catch(ignoreMissing);
    if (existing?.isDirectory()) throw new ConnectError("already_exists", `directory already exists: ${dir}`);
    if (existing) throw new ConnectError("invalid_argument", `path already exists but it is not a directory: ${dir}`);
    await mkdir(dir, { recursive: true }).catch((err: NodeJS.ErrnoException) => {
      throw new ConnectError("internal", `failed to create directory: ${err.message}`);
    });
    return { entry: { name: basename(dir), type: "FILE_TYPE_DIRECTORY", path: dir } };
  },

  "/filesystem.Filesystem/Stat": async (sandbox, { path }) => {
    const target = sandbox.resolvePath(String(path ?? ""));
    const stats = await lstat(target).catch(ignoreMissing);
    if (!stats) throw new ConnectError("not_found", `file not found: ${target}`);
    return { entry: await entryInfo(target, stats) };
  },

  "/filesystem.Filesystem/ListDir": async (sandbox, { path, depth }) => {
    const requested = sandbox.resolvePath(String(path ?? ""));
    const resolved = await realpath(requested).catch((err: NodeJS.ErrnoException) => {
      throw err.code === "ENOENT" ? new ConnectError("not_found", `path not found: ${requested}`) : err;
    });
    if (!(await stat(resolved)).isDirectory()) throw new ConnectError("invalid_argument", `path is not a directory: ${resolved}`);
    const entries: object[] = [];
    // Like envd: walk the resolved folder in lexical order, up to `depth`, never following symlinks.
    const walk = async (dir: string, level: number): Promise<void> => {
      const names = (await readdir(dir)).sort();
      for (const name of names) {
        const full = join(dir, name);
        const stats = await lstat(full).catch(ignoreMissing);
        if (!stats) continue;
        entries.push(await entryInfo(full, stats));
        if (stats.isDirectory() && level < Math.max(1, Number(depth ?? 1))) await walk(full, level + 1);
      }
    };
    await walk(resolved, 1);
    return { entries };
  },

  "/filesystem.Filesystem/Remove": async (sandbox, { path }) => {
    // A file, or a folder with all it holds (a final symlink itself, not what it points to).
    await rm(sandbox.resolvePath(String(path ?? "")), { recursive: true, force: true }).catch((err: NodeJS.ErrnoException) => {
      throw new ConnectError("internal", `failed to remove: ${err.message}`);
    });
    return {};
  },

  "/process.Process/SendSignal": async (sandbox, message) => {
    const selector = message.process as { pid?: number } | undefined;
    const pid = Number(selector?.pid);
    const running = sandbox.processes.get(pid);
    if (!running) throw new ConnectError("not_found", `process with pid ${pid} not found`);
    const signal = SIGNALS[String(message.signal)];
    if (!signal) throw new ConnectError("invalid_argument", `unsupported signal ${String(message.signal)}`);
    // envd stops sending a process's output once it is told to end.
    running.stopOutput();
    running.child.kill(signal);
    return {};
  },
};

/** The protobuf enum `process.Signal`, by JSON name and by number. */
const SIGNALS: Record<string, NodeJS.Signals> = {
  SIGNAL_SIGKILL: "SIGKILL",
  "9": "SIGKILL",
  SIGNAL_SIGTERM: "SIGTERM",
  "15": "SIGTERM",
};

/** How Go (and so envd) names the signal that ended a process: `signal: killed`. */
const GO_SIGNAL_NAMES: Partial<Record<NodeJS.Signals, string>> = {
  SIGHUP: "hangup",
  SIGINT: "interrupt",
  SIGQUIT: "quit",
  SIGILL: "illegal instruction",
  SIGTRAP: "trace/breakpoint trap",
  SIGABRT: "aborted",
  SIGBUS: "bus error",
  SIGFPE: "floating point exception",
  SIGKILL: "killed",
  SIGUSR1: "user defined signal 1",
  SIGSEGV: "segmentation fault",
  SIGUSR2: "user defined signal 2",
  SIGPIPE: "broken pipe",
  SIGALRM: "alarm clock",
  SIGTERM: "terminated",
  SIGXCPU: "CPU time limit exceeded",
};

/**
 * `process.Process/Start`: runs `cmd args` as a real child process with the sandbox's user
 * environment, streams `start`, `data` and `end` events (and `keepalive` ones), and kills the
 * process when the call's `Connect-Timeout-Ms` passes. A client that goes away leaves the
 * process running, as envd does.
 */
async function startProcess(sandbox: StandInSandbox, req: IncomingMessage, res: ServerResponse): Promise<void> {
  let message: Record<string, unknown>;
  try {
    message = await readStreamRequest(req);
  } catch (err) {
    return new ResponseStream(res).end(err instanceof ConnectError ? err : new ConnectError("invalid_argument", (err as Error).message));
  }
  const stream = new ResponseStream(res);
  const config = message.process as { cmd?: string; args?: string[]; envs?: Record<string, string>; cwd?: string } | undefined;
  try {
    if (message.pty) throw new ConnectError("unimplemented", "the stand-in has no pseudo-terminals");
    if (!config?.cmd) throw new ConnectError("invalid_argument", "process.cmd is required");
    sandbox.started.push(config);
    const cwd = sandbox.resolvePath(config.cwd || sandbox.home);
    if (!(await stat(cwd).catch(ignoreMissing))?.isDirectory()) throw new ConnectError("invalid_argument", `cwd '${cwd}' does not exist`);
    const user = userInfo().username;
    const env = {
      PATH: process.env.PATH ?? DEFAULT_PATH,
      HOME: sandbox.home,
      USER: user,
      LOGNAME: user,
      ...sandbox.envVars,
      ...(config.envs ?? {}),
    };
    const stdin = message.stdin === undefined || message.stdin === true ? "pipe" : "ignore";
    const child = spawn(config.cmd, config.args ?? [], { cwd, env, stdio: [stdin, "pipe", "pipe"] });
    await new Promise<void>((resolve, reject) => {
      child.once("spawn", resolve);
      child.once("error", (err) => reject(new ConnectError("invalid_argument", `error starting process '${config.cmd}': ${err.message}`)));
    });
    const pid = child.pid ?? 0;
    let output = true;
    sandbox.track(pid, { child, stopOutput: () => (output = false) });
    stream.send({ event: { start: { pid } } });

    const timers: NodeJS.Timeout[] = [];
    const keepaliveMs = Number(req.headers["keepalive-ping-interval"] ?? 0) * 1000;
    let keepalive: NodeJS.Timeout | undefined;
    const armKeepalive = () => {
      clearTimeout(keepalive);
      if (keepaliveMs <= 0) return;
      keepalive = setTimeout(() => {
        stream.send({ event: { keepalive: {} } });
        armKeepalive();
      }, keepaliveMs);
    };
    armKeepalive();
    const deadlineMs = Number(req.headers["connect-timeout-ms"] ?? 0);
    if (deadlineMs > 0) timers.push(setTimeout(() => child.kill("SIGKILL"), deadlineMs));

    const forward = (name: "stdout" | "stderr") => (chunk: Buffer) => {
      if (!output) return;
      stream.send({ event: { data: { [name]: chunk.toString("base64") } } });
      armKeepalive();
    };
    child.stdout?.on("data", forward("stdout"));
    child.stderr?.on("data", forward("stderr"));
    // Go's Wait closes the pipes once the process exits: whatever it left running that still
    // holds them does not delay the end event.
    child.once("exit", () => {
      timers.push(
        setTimeout(() => {
          child.stdout?.destroy();
          child.stderr?.destroy();
        }, 50),
      );
    });
    child.once("close", (code: number | null, signal: NodeJS.Signals | null) => {
      for (const t of timers) clearTimeout(t);
      clearTimeout(keepalive);
      sandbox.processes.delete(pid);
      stream.send({ event: { end: endEvent(code, signal) } });
      stream.end();
    });
  } catch (err) {
    stream.end(err instanceof ConnectError ? err : new ConnectError("internal", (err as Error).message));
  }
}

/** The `EndEvent` envd sends: Go's `ProcessState` of the ended process. */
function endEvent(code: number | null, signal: NodeJS.Signals | null): object {
  if (signal !== null) {
    const status = `signal: ${GO_SIGNAL_NAMES[signal] ?? signal}`;
    return { exitCode: -1, exited: false, status, error: status };
  }
  const status = `exit status ${code ?? 0}`;
  return code === 0 ? { exitCode: 0, exited: true, status } : { exitCode: code, exited: true, status, error: status };
}

/** `GET /files?path=`: the file's bytes; 404 when missing, 400 for a folder (symlinks are followed). */
async function download(sandbox: StandInSandbox, url: URL, _req: IncomingMessage, res: ServerResponse): Promise<void> {
  const path = sandbox.resolvePath(url.searchParams.get("path") ?? "");
  const stats = await stat(path).catch(ignoreMissing);
  if (!stats) throw new HttpError(404, `path '${path}' does not exist`);
  if (stats.isDirectory()) throw new HttpError(400, `path '${path}' is a directory`);
  res.writeHead(200, { "content-type": "application/octet-stream", "content-length": stats.size });
  await pipeline(createReadStream(path), res);
}

/**
 * `POST /files`: a raw `application/octet-stream` body to `?path=`, or `multipart/form-data`
 * with `file` parts (to `?path=`, else to each part's file name). Creates parent folders.
 */
async function upload(sandbox: StandInSandbox, url: URL, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const type = req.headers["content-type"] ?? "";
  const path = url.searchParams.get("path");
  const written: object[] = [];
  if (type.startsWith("application/octet-stream")) {
    if (!path) throw new HttpError(400, "path query parameter is required for raw body upload");
    const target = sandbox.resolvePath(path);
    await writeInto(target, req);
    written.push({ name: basename(target), type: "file", path: target });
  } else if (type.startsWith("multipart/")) {
    const body = Readable.toWeb(req) as unknown as ReadableStream<Uint8Array>;
    const form = await new Request("http://envd/files", {
      method: "POST",
      headers: { "content-type": type },
      body,
      duplex: "half",
    }).formData();
    for (const [name, value] of form) {
      if (name !== "file" || typeof value === "string") continue;
      const target = sandbox.resolvePath(path ?? value.name);
      await writeInto(target, Readable.fromWeb(value.stream() as NodeReadableStream<Uint8Array>));
      written.push({ name: basename(target), type: "file", path: target });
    }
  } else {
    throw new HttpError(400, `unsupported content type: ${type}, expected multipart/form-data or application/octet-stream`);
  }
  const body = JSON.stringify(written);
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

async function writeInto(target: string, data: Readable): Promise<void> {
  await mkdir(dirname(target), { recursive: true }).catch((err: NodeJS.ErrnoException) => {
    throw new HttpError(500, `error ensuring directories: ${err.message}`);
  });
  if ((await stat(target).catch(ignoreMissing))?.isDirectory()) throw new HttpError(400, `path is a directory: ${target}`);
  await pipeline(data, createWriteStream(target));
}

/** envd's `EntryInfo` in protobuf JSON (int64 as a string, enum by name, timestamp as RFC 3339). */
async function entryInfo(path: string, stats: Stats): Promise<object> {
  const type = stats.isSymbolicLink()
    ? "FILE_TYPE_SYMLINK"
    : stats.isDirectory()
      ? "FILE_TYPE_DIRECTORY"
      : stats.isFile()
        ? "FILE_TYPE_FILE"
        : "FILE_TYPE_UNSPECIFIED";
  return {
    name: basename(path),
    type,
    path,
    size: String(stats.size),
    mode: stats.mode & 0o777,
    permissions: permissions(stats),
    owner: String(stats.uid),
    group: String(stats.gid),
    modifiedTime: stats.mtime.toISOString(),
    ...(stats.isSymbolicLink() ? { symlinkTarget: await readlink(path).catch(() => "") } : {}),
  };
}

/** Go's `FileMode.String()`, e.g. `-rw-r--r--`, `drwxr-xr-x`, `Lrwxrwxrwx`. */
function permissions(stats: Stats): string {
  const kind = stats.isDirectory() ? "d" : stats.isSymbolicLink() ? "L" : "-";
  let out = kind;
  for (let bit = 8; bit >= 0; bit -= 1) out += stats.mode & (1 << bit) ? "rwx"[(8 - bit) % 3] : "-";
  return out;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** envd's error body: `{ code, message }`. */
function httpError(res: ServerResponse, status: number, message: string): void {
  const body = JSON.stringify({ code: status, message });
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

function ignoreMissing(err: NodeJS.ErrnoException): undefined {
  if (err.code === "ENOENT" || err.code === "ENOTDIR") return undefined;
  throw err;
}
