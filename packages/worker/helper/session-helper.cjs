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
//                      {"t":"connect","id":"7","port":8080}         (a TCP connection to 127.0.0.1, else ::1, here)
//                      {"t":"send","id":"7","d":"<base64>"}         (bytes for it; "end":true ends its writing side)
//                      {"t":"ack","id":"7","n":65536}               (bytes of its "data" the worker has taken)
//                      {"t":"hangup","id":"7"}                      (drop it)
//                      {"t":"pty","id":"8","argv":[...],"env":{...},"cwd":"sub","cols":80,"rows":24}
//                                                                   (a process on a terminal: its bytes as a connection's)
//                      {"t":"resize","id":"8","cols":120,"rows":40}
//   helper -> worker   {"t":"ready"}
//                      {"t":"out","id":"1","s":"stdout"|"stderr","d":"<base64>"}
//                      {"t":"exit","id":"1","code":0,"signal":null}   or  ..."error":"why it did not start"
//                      {"t":"done","id":"2",...}                      or  ..."error":"why","code":"ENOENT"
//                      {"t":"data","id":"7","d":"<base64>"}         (bytes from a connection; "end":true: it sends no more)
//                      {"t":"ack","id":"7","n":65536}               (bytes of "send" written to it)
//                      {"t":"hangup","id":"7","error":"..."}        (it closed; "error" when it failed)
//
// A terminal (docs/sessions.md#shell) is util-linux's `script` running `argv` (default: bash, else
// sh) on a new pseudo-terminal, answered by a "done" once started; its bytes go as a connection's
// ("send"/"data"/"ack"/"hangup", the keys typed in and what it shows out), then an "exit" once it
// ended. "resize" sets its window's size (`stty -F` on the terminal `script` holds); "kill" hangs
// it up (SIGHUP to what runs on it, SIGKILL 2 s later).
//
// A connection (docs/sessions.md#ports) is answered by a "done" once open (or with its "error"
// and "code"), then its bytes go both ways as frames, each side sending at most TUNNEL_WINDOW
// bytes the other has not acknowledged. It reaches only this container's loopback: the worker
// names a port, never a host.
//
// Files are read and written here, inside the container, and not by the worker in the
// bind-mounted folder: a command running meanwhile could swap a folder for a symlink under the
// worker's feet, and the worker (often root) would follow it on its own machine.
//
// The helper's own verbs are asked as commands whose argv[0] is `boxcar-helper`, and answered
// as a command is (their output in `out` frames, then an `exit`; `kill` stops one):
//
//   boxcar-helper hash PATH           a line {"size":N,"sha256":"<hex>","executable":B}: a file's SHA-256, read whole here
//   boxcar-helper watch PATH          a line {"ready":true,"folders":N}, then one {"path","change"} a change, until killed
//   boxcar-helper input KEY [--end]   its stdin written to the stdin of the command started with
//                                     BOXCAR_HELPER_STDIN=KEY in its env (kept open for this), then closed with --end
//
// Exit 0: done; 1: refused (why on stderr); 2: no such file or folder. A command started with
// BOXCAR_HELPER_STDIN in its env (taken out of it) keeps its stdin open after its `stdin`.
//
// Run as `node -e <this file> watch PATH` (a host session's watch), it runs that verb alone in
// the current folder, printing its lines on stdout.
//
// It runs as the agent's user, as every command does, so a command can tamper with it: the
// worker trusts its frames only about that session's own commands and files, and bounds them.
// Plain CommonJS for the Node.js of the agent image (18 and later; Node 18 has no recursive
// fs.watch on Linux, so a watch walks its folders and watches each); no dependencies.
"use strict";
const { execFile, spawn } = require("node:child_process");
const { createHash } = require("node:crypto");
const fs = require("node:fs/promises");
const {
  constants: fsConstants,
  createReadStream,
  existsSync,
  lstatSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  statSync,
  watch,
} = require("node:fs");
const { dirname, join, relative, sep } = require("node:path");
const { connect: netConnect } = require("node:net");
const { Duplex } = require("node:stream");
const { createInterface } = require("node:readline");

/** A verb run alone (`node -e <helper> watch PATH`, a host session's), in the current folder; else the container's workspace. */
const CLI_VERB = process.argv[1] === "watch" ? process.argv[1] : undefined;
const WORKSPACE = CLI_VERB ? process.cwd() : "/workspace";
/** How long a command has after SIGTERM before its process group gets SIGKILL, and its pipes after it ends. */
const GRACE_MS = 2000;

/** The commands under way, by id: a session's host sends one at a time; a prompt agent's sandbox may run an MCP server beside its tools. */
const running = new Map();
/** Commands whose stdin stays open for input, by the key their start named (BOXCAR_HELPER_STDIN). */
const inputs = new Map();

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
  if (req.argv[0] === "boxcar-helper") {
    verb(req, finish);
    return;
  }
  const cwd = req.cwd ? inWorkspace(req.cwd) : WORKSPACE;
  if (!isFolder(cwd)) {
    finish({ code: null, signal: null, error: `cwd ${req.cwd}: no such folder in the workspace` });
    return;
  }
  // Its stdin stays open for input (`boxcar-helper input KEY`): the key is the helper's, not the command's.
  const env = { ...req.env };
  const inputKey = env.BOXCAR_HELPER_STDIN;
  delete env.BOXCAR_HELPER_STDIN;
  try {
    child = spawn(req.argv[0], req.argv.slice(1), {
      cwd,
      env,
      detached: true,
      stdio: ["pipe", "pipe", "pipe"],
    });
  } catch (err) {
    finish({ code: null, signal: null, error: err.message });
    return;
  }
  running.set(id, { child, timers });
  if (typeof inputKey === "string" && inputKey !== "") {
    inputs.set(inputKey, child);
    child.once("close", () => {
      if (inputs.get(inputKey) === child) inputs.delete(inputKey);
    });
  }
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
  const stdin = req.stdin ? Buffer.from(req.stdin, "base64") : undefined;
  if (inputs.get(inputKey) === child) {
    if (stdin) child.stdin.write(stdin);
  } else child.stdin.end(stdin);
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

/**
 * One of the helper's own verbs (`boxcar-helper VERB ...`), answered as a command: its lines as
 * output, then its exit (0 done, 1 refused, 2 no such file or folder; why on stderr).
 */
function verb(req, finish) {
  const id = req.id;
  const [, name, ...args] = req.argv;
  const out = (frame) => send({ t: "out", id, s: "stdout", d: Buffer.from(`${JSON.stringify(frame)}\n`).toString("base64") });
  const fail = (code, message) => {
    send({ t: "out", id, s: "stderr", d: Buffer.from(`${message}\n`).toString("base64") });
    finish({ code, signal: null });
  };
  const entry = { timers: [] };
  running.set(id, entry);
  try {
    if (name === "hash") {
      entry.stop = () => finish({ code: null, signal: "SIGTERM" });
      hashFile(args[0] ?? "").then(
        (hashed) => {
          out(hashed);
          finish({ code: 0, signal: null });
        },
        (err) => fail(err.code === "ENOENT" ? 2 : 1, err.message),
      );
    } else if (name === "watch") {
      const stop = watchPath(args[0] ?? "", out);
      entry.stop = () => {
        stop();
        finish({ code: null, signal: "SIGTERM" });
      };
    } else if (name === "input") {
      entry.stop = () => finish({ code: null, signal: "SIGTERM" });
      input(args[0], req.stdin ? Buffer.from(req.stdin, "base64") : Buffer.alloc(0), args[1] === "--end", (err) =>
        err ? fail(1, err) : finish({ code: 0, signal: null }),
      );
    } else fail(1, `boxcar-helper has no verb ${name}`);
  } catch (err) {
    fail(err.code === "ENOENT" ? 2 : 1, err.message);
  }
}

/** Writes `data` to the stdin of the command started with input key `key`, then closes it if `end`; `done` gets why not, if not. */
function input(key, data, end, done) {
  const child = inputs.get(key);
  if (!child || child.stdin.destroyed || child.stdin.writableEnded) {
    done(`no command takes input as ${key}: it ended, or its stdin was closed`);
    return;
  }
  const written = (err) => {
    if (err) {
      done(`its stdin is closed (${err.code ?? err.message})`);
      return;
    }
    if (end) {
      inputs.delete(key);
      child.stdin.end();
    }
    done();
  };
  if (data.length > 0) child.stdin.write(data, written);
  else written();
}

/** A file's size and SHA-256, read whole. */
function hashFile(path) {
  return new Promise((resolve, reject) => {
    let target;
    let executable;
    try {
      target = inWorkspace(path);
      const stats = statSync(target);
      if (!stats.isFile()) throw Object.assign(new Error(`${path} is not a regular file`), { code: "ENOENT" });
      executable = (stats.mode & 0o111) !== 0;
    } catch (err) {
      reject(err);
      return;
    }
    const hash = createHash("sha256");
    let size = 0;
    createReadStream(target, { flags: fsConstants.O_RDONLY | fsConstants.O_NONBLOCK })
      .on("data", (chunk) => {
        size += chunk.length;
        hash.update(chunk);
      })
      .on("error", reject)
      .on("end", () => resolve({ size, sha256: hash.digest("hex"), executable }));
  });
}

/** The most folders one watch takes an inotify watch on: each counts toward the machine's per-user limit. */
const MAX_WATCHED_FOLDERS = 8192;
/** Changes are gathered this long (an editor's save is several), then said once each. */
const WATCH_BATCH_MS = 100;
/** The most changes said at once; past it, one overflow. */
const MAX_BATCH = 1000;

/**
 * Watches `path` (a folder of the workspace, walked and each of its folders watched as it comes,
 * or a file) and says each change as `out({ path, change })`, `change` one of created, modified,
 * removed (gathered for `WATCH_BATCH_MS`: a file made and written is `created`, made and removed
 * is nothing). Says `{ ready, folders }` once its folders are watched. Links are never followed.
 * Returns what stops it. Throws (ENOENT) when there is no such file or folder, or it is a link.
 */
function watchPath(path, out) {
  const root = path ? inWorkspace(path) : WORKSPACE;
  const top = lstatSync(root);
  const real = realpathSync(root);
  const workspace = realpathSync(WORKSPACE);
  if (top.isSymbolicLink() || (real !== workspace && !real.startsWith(workspace + sep))) {
    throw Object.assign(new Error(`${path} is a link: a watch follows none`), { code: "EINVAL" });
  }
  if (!top.isDirectory() && !top.isFile()) throw Object.assign(new Error(`${path} is no file or folder`), { code: "ENOENT" });
  const watchers = new Map();
  /** What is there, by absolute path: "folder" or "file" (anything not a folder). */
  const known = new Map();
  const pending = new Map();
  let flushing;
  let overflowed = false;
  let stopped = false;
  const only = top.isFile() ? root : undefined;
  const name = (abs) => relative(WORKSPACE, abs).split(sep).join("/");

  const note = (abs, change) => {
    const key = name(abs);
    const before = pending.get(key);
    if (before === "created" && change === "removed") pending.delete(key);
    else if (before === "created" && change === "modified") return;
    else if (before === "removed" && change === "created") pending.set(key, "modified");
    else pending.set(key, change);
    flushing ??= setTimeout(flush, WATCH_BATCH_MS);
  };
  const flush = () => {
    flushing = undefined;
    if (stopped) return;
    let said = 0;
    for (const [changed, change] of pending) {
      if (said >= MAX_BATCH) {
        out({ path: name(root) || ".", change: "overflow" });
        break;
      }
      out({ path: changed, change });
      said += 1;
    }
    pending.clear();
  };
  const unwatch = (abs) => {
    for (const [dir, watcher] of watchers) {
      if (dir === abs || dir.startsWith(abs + sep)) {
        watcher.close();
        watchers.delete(dir);
      }
    }
    for (const path of known.keys()) if (path.startsWith(abs + sep)) known.delete(path);
  };
  /** Watches folder `dir` and walks it; `fresh`: it came after the watch started, so what is in it is new. */
  const add = (dir, fresh) => {
    if (watchers.has(dir)) return;
    if (watchers.size >= MAX_WATCHED_FOLDERS) {
      if (!overflowed) out({ path: name(dir) || ".", change: "overflow" });
      overflowed = true;
      return;
    }
    let watcher;
    try {
      watcher = watch(dir, { persistent: true }, (_type, entry) => {
        if (!stopped) changed(dir, entry);
      });
    } catch (err) {
      // Gone meanwhile; or the machine's inotify watches are all taken.
      if (err.code !== "ENOENT" && err.code !== "ENOTDIR" && !overflowed) {
        overflowed = true;
        out({ path: name(dir) || ".", change: "overflow" });
      }
      return;
    }
    watcher.on("error", () => {
      watcher.close();
      watchers.delete(dir);
    });
    watchers.set(dir, watcher);
    let entries = [];
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const entry of entries) {
      const abs = join(dir, entry.name);
      if (only && abs !== only) continue;
      if (known.has(abs)) continue;
      known.set(abs, entry.isDirectory() ? "folder" : "file");
      if (fresh) note(abs, "created");
      if (entry.isDirectory()) add(abs, fresh);
    }
  };
  /** Something named `entry` changed in folder `dir` (inotify says which, not how: lstat tells). */
  const changed = (dir, entry) => {
    if (!entry) {
      // The kernel dropped events (its queue overflowed): say so, and look again at the folder.
      out({ path: name(dir) || ".", change: "overflow" });
      return;
    }
    const abs = join(dir, entry.toString());
    if (only && abs !== only) return;
    let stats;
    try {
      stats = lstatSync(abs);
    } catch {
      stats = undefined;
    }
    const was = known.get(abs);
    if (!stats) {
      if (!was) return;
      known.delete(abs);
      if (was === "folder") unwatch(abs);
      note(abs, "removed");
      return;
    }
    const kind = stats.isDirectory() ? "folder" : "file";
    if (was === undefined) {
      known.set(abs, kind);
      note(abs, "created");
      if (kind === "folder") add(abs, true);
    } else if (was !== kind) {
      // Replaced by another kind of thing (a file by a folder, say).
      if (was === "folder") unwatch(abs);
      known.set(abs, kind);
      note(abs, "modified");
      if (kind === "folder") add(abs, true);
    } else if (kind === "file") note(abs, "modified");
  };

  if (only) {
    known.set(only, "file");
    add(dirname(only), false);
  } else add(root, false);
  out({ ready: true, folders: watchers.size });
  return () => {
    stopped = true;
    clearTimeout(flushing);
    for (const watcher of watchers.values()) watcher.close();
    watchers.clear();
  };
}

/** Open connections to ports of this container's loopback, by the id of their "connect". */
const tunnels = new Map();
/** The most bytes of a connection's sent to the worker and not acknowledged, and the most in one frame. */
const TUNNEL_WINDOW = 256 * 1024;
const TUNNEL_CHUNK = 48 * 1024;
/** How long a connection may take to open. */
const CONNECT_TIMEOUT_MS = 10000;

/** Opens a connection to `req.port` on this container's loopback (127.0.0.1, else ::1) and relays its bytes. */
function openTunnel(req) {
  const id = req.id;
  const port = req.port;
  if (!Number.isInteger(port) || port < 1 || port > 65535 || tunnels.has(id)) {
    send({ t: "done", id, error: `no port ${port}`, code: "EINVAL" });
    return;
  }
  const attempt = (hosts, firstError) => {
    const host = hosts[0];
    if (host === undefined) {
      send({ t: "done", id, error: firstError.message, code: firstError.code });
      return;
    }
    const socket = netConnect({ host, port, allowHalfOpen: true });
    const timer = setTimeout(
      () => socket.destroy(Object.assign(new Error(`no answer from ${host}:${port}`), { code: "ETIMEDOUT" })),
      CONNECT_TIMEOUT_MS,
    );
    socket.once("error", (err) => {
      clearTimeout(timer);
      const next = err.code === "ECONNREFUSED" || err.code === "EADDRNOTAVAIL" || err.code === "EAFNOSUPPORT";
      if (next) attempt(hosts.slice(1), firstError ?? err);
      else send({ t: "done", id, error: err.message, code: err.code });
    });
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.removeAllListeners("error");
      relay(id, socket);
      send({ t: "done", id });
    });
  };
  attempt(["127.0.0.1", "::1"], undefined);
}

/** Relays an open connection's bytes as frames, holding it back while the worker has a window's worth unacknowledged. */
function relay(id, socket) {
  const tunnel = { socket, unacked: 0, stdoutFull: false, error: undefined };
  tunnels.set(id, tunnel);
  const flow = () => {
    if (tunnel.unacked >= TUNNEL_WINDOW || tunnel.stdoutFull) socket.pause();
    else socket.resume();
  };
  socket.on("data", (chunk) => {
    for (let at = 0; at < chunk.length; at += TUNNEL_CHUNK) {
      const part = chunk.subarray(at, at + TUNNEL_CHUNK);
      tunnel.unacked += part.length;
      if (!send({ t: "data", id, d: part.toString("base64") }) && !tunnel.stdoutFull) {
        tunnel.stdoutFull = true;
        process.stdout.once("drain", () => {
          tunnel.stdoutFull = false;
          flow();
        });
      }
    }
    flow();
  });
  socket.on("end", () => send({ t: "data", id, end: true }));
  socket.on("error", (err) => {
    tunnel.error = err.message;
  });
  socket.on("close", () => {
    if (tunnels.get(id) !== tunnel) return;
    tunnels.delete(id);
    send({ t: "hangup", id, ...(tunnel.error ? { error: tunnel.error } : {}) });
  });
  tunnel.ack = (n) => {
    tunnel.unacked = Math.max(0, tunnel.unacked - n);
    flow();
  };
}

/** A frame of the worker's for an open connection: bytes for it, its end, an acknowledgement, or a hangup. */
function tunnelFrame(req) {
  const tunnel = tunnels.get(req.id);
  if (!tunnel) return;
  if (req.t === "ack") tunnel.ack(Number(req.n) || 0);
  else if (req.t === "hangup") {
    tunnels.delete(req.id);
    tunnel.socket.destroy();
  } else if (req.t === "send") {
    if (typeof req.d === "string" && req.d !== "") {
      const data = Buffer.from(req.d, "base64");
      tunnel.socket.write(data, (err) => {
        if (!err) send({ t: "ack", id: req.id, n: data.length });
      });
    }
    if (req.end === true) tunnel.socket.end();
  }
}

/** A shell word: single-quoted. */
function quote(text) {
  return `'${String(text).replaceAll("'", "'\\''")}'`;
}

/** Starts `req.argv` (default: bash, else sh) on a new pseudo-terminal (`script`'s) and relays its bytes as a connection's. */
function openTerminal(req) {
  const id = req.id;
  const cols = Number(req.cols);
  const rows = Number(req.rows);
  if (running.has(id) || tunnels.has(id) || !Number.isInteger(cols) || !Number.isInteger(rows) || cols < 1 || rows < 1) {
    send({ t: "done", id, error: "a terminal needs a fresh id and a size", code: "EINVAL" });
    return;
  }
  let cwd;
  try {
    cwd = req.cwd ? inWorkspace(req.cwd) : WORKSPACE;
  } catch (err) {
    send({ t: "done", id, error: err.message, code: err.code });
    return;
  }
  if (!isFolder(cwd)) {
    send({ t: "done", id, error: `cwd ${req.cwd}: no such folder in the workspace`, code: "ENOENT" });
    return;
  }
  const shell = ["/bin/bash", "/usr/bin/bash"].find((path) => existsSync(path)) ?? "/bin/sh";
  const argv = Array.isArray(req.argv) && req.argv.length > 0 ? req.argv : [shell];
  const env = { ...req.env };
  for (const name of Object.keys(env)) if (name.startsWith("BOXCAR_HELPER")) delete env[name];
  // `script` runs the line with $SHELL (sh); the line sets the window's size and the caller's SHELL, then runs argv.
  const line = `stty rows ${rows} cols ${cols} 2>/dev/null; SHELL=${quote(env.SHELL ?? shell)}; export SHELL; exec ${argv.map(quote).join(" ")}`;
  let child;
  try {
    child = spawn("script", ["-qfec", line, "/dev/null"], {
      cwd,
      env: { ...env, SHELL: "/bin/sh" },
      detached: true,
      stdio: ["pipe", "pipe", "pipe"],
    });
  } catch (err) {
    send({ t: "done", id, error: err.message, code: err.code });
    return;
  }
  const entry = { child, timers: [] };
  let started = false;
  let shellPid;
  child.once("error", (err) => {
    if (started) return;
    running.delete(id);
    const why =
      err.code === "ENOENT" ? "a terminal needs util-linux's `script` in the image (Debian's bsdutils), and it has none" : err.message;
    send({ t: "done", id, error: why, code: err.code });
  });
  child.once("spawn", () => {
    started = true;
    child.stdin.on("error", () => {});
    child.stderr.resume();
    const io = Duplex.from({ readable: child.stdout, writable: child.stdin });
    io.on("error", () => {});
    entry.io = io;
    relay(id, io);
    send({ t: "done", id });
    findChild(child.pid, (pid) => {
      shellPid = pid;
    });
  });
  entry.stop = () => {
    // A hangup, as a terminal that closes gives; `script` ends once what ran on it has.
    if (shellPid !== undefined) signalGroup(shellPid, "SIGHUP");
    signalGroup(child.pid, "SIGTERM");
    entry.timers.push(
      setTimeout(() => {
        if (shellPid !== undefined) signalGroup(shellPid, "SIGKILL");
        signalGroup(child.pid, "SIGKILL");
      }, GRACE_MS),
    );
  };
  entry.resize = coalesced((c, r, done) => {
    const tty = terminalOf(child.pid);
    if (!tty) return done();
    execFile("stty", ["-F", tty, "rows", String(r), "cols", String(c)], { env }, () => done());
  });
  running.set(id, entry);
  child.once("close", (code, signal) => {
    if (!started) return;
    for (const timer of entry.timers) clearTimeout(timer);
    running.delete(id);
    send({ t: "exit", id, code, signal });
    // What it showed went first; its connection ends with it.
    entry.io.destroy();
  });
}

/** A resize run one at a time, the last size asked winning over those that waited. */
function coalesced(apply) {
  let wanted;
  let busy = false;
  const next = () => {
    if (!wanted) {
      busy = false;
      return;
    }
    const [c, r] = wanted;
    wanted = undefined;
    apply(c, r, next);
  };
  return (c, r) => {
    wanted = [c, r];
    if (busy) return;
    busy = true;
    next();
  };
}

/** The terminal (`/dev/pts/N`) process `pid` holds open: `script` keeps its terminal's other end. */
function terminalOf(pid) {
  try {
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      try {
        const target = readlinkSync(`/proc/${pid}/fd/${fd}`);
        if (/^\/dev\/pts\/\d+$/.test(target)) return target;
      } catch {
        // closed meanwhile
      }
    }
  } catch {
    // gone
  }
  return undefined;
}

/** Tells `found` the first child of `pid` (the shell `script` started), looked for a little while it starts. */
function findChild(pid, found, tries = 0) {
  let children = "";
  try {
    children = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
  } catch {
    return;
  }
  const first = Number(children.split(/\s+/)[0]);
  if (Number.isInteger(first) && first > 0) found(first);
  else if (tries < 50) setTimeout(() => findChild(pid, found, tries + 1), 20);
}

/** A frame resizing a terminal. */
function resize(req) {
  const entry = running.get(req.id);
  const cols = Number(req.cols);
  const rows = Number(req.rows);
  if (entry?.resize && Number.isInteger(cols) && Number.isInteger(rows) && cols >= 1 && rows >= 1 && cols <= 10000 && rows <= 10000)
    entry.resize(cols, rows);
}

function kill(req) {
  const command = running.get(req.id);
  if (command?.stop) {
    command.stop();
    return;
  }
  if (command?.child?.pid === undefined) return;
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

/** A verb run alone, its lines on stdout, until SIGTERM (a host session's watch). */
function runAlone() {
  const out = (frame) => process.stdout.write(`${JSON.stringify(frame)}\n`);
  const fail = (code, message) => {
    process.stderr.write(`${message}\n`);
    process.exit(code);
  };
  try {
    const stop = watchPath(process.argv[2] ?? "", out);
    process.once("SIGTERM", () => {
      stop();
      process.exit(0);
    });
  } catch (err) {
    fail(err.code === "ENOENT" ? 2 : 1, err.message);
  }
}

function serve() {
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
    else if (req.t === "connect") openTunnel(req);
    else if (req.t === "pty") openTerminal(req);
    else if (req.t === "resize") resize(req);
    else if (req.t === "send" || req.t === "ack" || req.t === "hangup") tunnelFrame(req);
    else if (Object.hasOwn(files, req.t)) fileOp(req);
  });
  // The worker is gone (or closed the session): nothing of the session runs on.
  lines.on("close", () => {
    for (const { socket } of tunnels.values()) socket.destroy();
    for (const { child } of running.values()) if (child?.pid !== undefined) signalGroup(child.pid, "SIGKILL");
    process.exit(0);
  });
  send({ t: "ready" });
}

if (CLI_VERB) runAlone();
else serve();
