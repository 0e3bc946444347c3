// The resident helper of a Docker session (docs/sessions.md). The worker starts it as the
// session container's command (`node -e <this file>`) and talks to it over the container's
// attached stdin and stdout, one JSON object a line, so a command costs no `docker exec`:
//
//   worker -> helper   {"t":"exec","id":"1","argv":[...],"env":{...},"cwd":"sub","stdin":"<base64>"}
//                      {"t":"kill","id":"1"}
//                      {"t":"read","id":"2","path":"a/b","max":524288}      (the whole file)
//                      {"t":"read","id":"2","path":"a/b","offset":0,"length":262144}  (a part; "size" is the file's)
//                      {"t":"write","id":"3","path":"a/b","d":"<base64>"}   ("append":true adds to the file)
//                      {"t":"mkdir","id":"6","path":"a/b"}
//                      {"t":"list","id":"4","path":"a","limit":1000}
//                      {"t":"remove","id":"5","path":"a/b"}
//   helper -> worker   {"t":"ready"}
//                      {"t":"out","id":"1","s":"stdout"|"stderr","d":"<base64>"}
//                      {"t":"exit","id":"1","code":0,"signal":null}   or  ..."error":"why it did not start"
//                      {"t":"done","id":"2",...}                      or  ..."error":"why","code":"ENOENT"
//
// Files are read and written here, inside the container, and not by the worker in the
// bind-mounted folder: a command running meanwhile could swap a folder for a symlink under the
// worker's feet, and the worker (often root) would follow it on its own machine.
//
// It runs as the agent's user, as every command does, so a command can tamper with it: the
// worker trusts its frames only about that session's own commands and files, and bounds them.
// Plain CommonJS for the Node.js of the agent image (18 and later); no dependencies.
"use strict";
const { spawn } = require("node:child_process");
const fs = require("node:fs/promises");
const { constants: fsConstants, statSync } = require("node:fs");
const { dirname, join } = require("node:path");
const { createInterface } = require("node:readline");

const WORKSPACE = "/workspace";
/** How long a command has after SIGTERM before its process group gets SIGKILL, and its pipes after it ends. */
const GRACE_MS = 2000;

/** The commands under way, by id: a session's host sends one at a time; a prompt agent's sandbox may run an MCP server beside its tools. */
const running = new Map();

function send(frame) {
  return process.stdout.write(`${JSON.stringify(frame)}\n`);
}

function signalGroup(pid, signal) {
  try {
    process.kill(-pid, signal);
  } catch {
    // the group is gone
  }
}

function run(req) {
  if (running.has(req.id)) {
    send({ t: "exit", id: req.id, code: null, signal: null, error: `command ${req.id} is already running` });
    return;
  }
  const id = req.id;
  const timers = [];
  let child;
  let done = false;
  const finish = (frame) => {
    if (done) return;
    done = true;
    for (const timer of timers) clearTimeout(timer);
    running.delete(id);
    send({ t: "exit", id, ...frame });
  };
  const cwd = req.cwd ? inWorkspace(req.cwd) : WORKSPACE;
  if (!isFolder(cwd)) {
    finish({ code: null, signal: null, error: `cwd ${req.cwd}: no such folder in the workspace` });
    return;
  }
  try {
    child = spawn(req.argv[0], req.argv.slice(1), {
      cwd,
      env: req.env,
      detached: true,
      stdio: ["pipe", "pipe", "pipe"],
    });
  } catch (err) {
    finish({ code: null, signal: null, error: err.message });
    return;
  }
  running.set(id, { child, timers });
  for (const stream of ["stdout", "stderr"]) {
    const pipe = child[stream];
    pipe.on("data", (chunk) => {
      // The worker reads slower than the command writes: hold the command back, not its output in memory.
      if (!send({ t: "out", id, s: stream, d: chunk.toString("base64") })) {
        pipe.pause();
        process.stdout.once("drain", () => pipe.resume());
      }
    });
  }
  child.stdin.on("error", () => {});
  child.stdin.end(req.stdin ? Buffer.from(req.stdin, "base64") : undefined);
  child.once("error", (err) => finish({ code: null, signal: null, error: err.message }));
  child.once("exit", () => {
    // The command ends with everything it started in its group; a process that left the
    // group may still hold the pipes open: stop waiting for it.
    signalGroup(child.pid, "SIGKILL");
    timers.push(
      setTimeout(() => {
        child.stdout.destroy();
        child.stderr.destroy();
      }, GRACE_MS),
    );
  });
  child.once("close", (code, signal) => finish({ code, signal }));
}

function kill(req) {
  const command = running.get(req.id);
  if (command?.child.pid === undefined) return;
  const pid = command.child.pid;
  signalGroup(pid, "SIGTERM");
  command.timers.push(setTimeout(() => signalGroup(pid, "SIGKILL"), GRACE_MS));
}

function isFolder(path) {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

/** Where a workspace-relative path is; the worker has refused `..` and absolute paths already. */
function inWorkspace(path) {
  if (typeof path !== "string" || path.split("/").includes(".."))
    throw Object.assign(new Error("the path leaves the workspace"), { code: "EINVAL" });
  return join(WORKSPACE, path);
}

const files = {
  async read(req) {
    const path = inWorkspace(req.path);
    if (req.length !== undefined) return readPart(path, req);
    const stats = await fs.stat(path);
    if (!stats.isFile()) throw Object.assign(new Error(`${req.path} is not a regular file`), { code: "ENOENT" });
    if (stats.size > req.max) throw Object.assign(new Error(`${req.path} has ${stats.size} bytes`), { code: "EFBIG" });
    const data = await fs.readFile(path);
    if (data.length > req.max) throw Object.assign(new Error(`${req.path} has more than ${req.max} bytes`), { code: "EFBIG" });
    return { size: data.length, d: data.toString("base64") };
  },
  async write(req) {
    const path = inWorkspace(req.path);
    const data = Buffer.from(req.d, "base64");
    await fs.mkdir(dirname(path), { recursive: true });
    // A named pipe (or anything but a file) there would hold the write for ever.
    const there = await fs.lstat(path).catch(() => undefined);
    if (there && !there.isFile()) throw Object.assign(new Error(`${req.path} is not a regular file`), { code: "EEXIST" });
    const mode = req.append ? fsConstants.O_APPEND : fsConstants.O_TRUNC;
    await fs.writeFile(path, data, { flag: fsConstants.O_WRONLY | fsConstants.O_CREAT | mode | fsConstants.O_NONBLOCK });
    if (req.executable) await fs.chmod(path, 0o755);
    return { size: data.length };
  },
  async list(req) {
    const found = [];
    let bytes = 0;
    let truncated = false;
    // At most `limit` files, and a listing that fits well in one message (`bytes` of it).
    const full = () => found.length >= req.limit || bytes >= req.bytes;
    const walk = async (dir, prefix) => {
      for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
        if (full()) {
          truncated = true;
          return;
        }
        const path = prefix ? `${prefix}/${entry.name}` : entry.name;
        if (entry.isDirectory()) await walk(join(dir, entry.name), path);
        else if (entry.isFile()) {
          found.push({ path, size: (await fs.lstat(join(dir, entry.name))).size });
          bytes += Buffer.byteLength(path) + 32;
        }
      }
    };
    const root = req.path ? inWorkspace(req.path) : WORKSPACE;
    if (!isFolder(root)) throw Object.assign(new Error(`${req.path}: no such folder`), { code: "ENOENT" });
    await walk(root, req.path ?? "");
    return { files: found.sort((a, b) => (a.path < b.path ? -1 : 1)), truncated };
  },
  async mkdir(req) {
    await fs.mkdir(inWorkspace(req.path), { recursive: true });
    return {};
  },
  async remove(req) {
    const path = inWorkspace(req.path);
    try {
      await fs.lstat(path);
    } catch (err) {
      if (err.code === "ENOENT") return { removed: false };
      throw err;
    }
    await fs.rm(path, { recursive: true, force: true });
    return { removed: true };
  },
};

/** Up to `length` bytes of a regular file from `offset`, with the file's size. */
async function readPart(path, req) {
  const file = await fs.open(path, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK);
  try {
    const stats = await file.stat();
    if (!stats.isFile()) throw Object.assign(new Error(`${req.path} is not a regular file`), { code: "ENOENT" });
    const buffer = Buffer.alloc(Math.max(0, Math.min(req.length, stats.size - req.offset)));
    const { bytesRead } = await file.read(buffer, 0, buffer.length, req.offset);
    return { size: stats.size, d: buffer.subarray(0, bytesRead).toString("base64") };
  } finally {
    await file.close();
  }
}

function fileOp(req) {
  files[req.t](req).then(
    (answer) => send({ t: "done", id: req.id, ...answer }),
    (err) => send({ t: "done", id: req.id, error: err.message, code: err.code }),
  );
}

const lines = createInterface({ input: process.stdin, crlfDelay: Number.POSITIVE_INFINITY });
lines.on("line", (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return;
  }
  if (req.t === "exec") run(req);
  else if (req.t === "kill") kill(req);
  else if (Object.hasOwn(files, req.t)) fileOp(req);
});
// The worker is gone (or closed the session): nothing of the session runs on.
lines.on("close", () => {
  for (const { child } of running.values()) if (child.pid !== undefined) signalGroup(child.pid, "SIGKILL");
  process.exit(0);
});
send({ t: "ready" });
