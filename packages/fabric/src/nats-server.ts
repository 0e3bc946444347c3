import { type ChildProcess, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";

export interface NatsServerOptions {
  /** TCP port for clients; default: a free port. */
  port?: number;
  /** The address clients connect to; default 127.0.0.1 (this machine only). */
  host?: string;
  /** Where JetStream keeps its data; default: a new temporary folder, removed on stop. */
  storeDir?: string;
  /** The nats-server binary; default: `$BOXCAR_NATS_SERVER`, then `.boxcar/tools/bin`, then PATH. */
  binary?: string;
  /** Extra lines for the server's config file. */
  extraConfig?: string;
  /** The server's name (unique within a cluster); default `boxcar-<port>`. */
  serverName?: string;
  /** Joins a JetStream cluster: its name, this server's route port, and the other servers' routes. */
  cluster?: NatsClusterOptions;
  /** The most JetStream may keep on disk (`max_file_store`), in bytes; default: the server's own (a share of the disk). */
  maxFileStore?: number;
  /** A WebSocket listener for browsers (the dashboard), without TLS: listen on a loopback address only. */
  websocket?: NatsWebsocketOptions;
}

export interface NatsWebsocketOptions {
  readonly host: string;
  readonly port: number;
  /**
   * The only page origins whose connections are accepted (`http://host:port`). Required: without
   * it any web page a local browser opens could use the listener, as whoever its server trusts.
   */
  readonly allowedOrigins: readonly string[];
}

export interface NatsClusterOptions {
  name: string;
  /** Port this server listens on for routes from the other servers of the cluster. */
  port: number;
  /** Route URLs of the other servers, e.g. `nats-route://127.0.0.1:6223`. */
  routes: readonly string[];
}

/** A nats-server child process with JetStream enabled. */
export interface NatsServer extends AsyncDisposable {
  readonly url: string;
  readonly port: number;
  readonly storeDir: string;
  readonly pid: number;
  /**
   * The pid of a server on the same store folder that was still running when this one started
   * (its owner killed with SIGKILL, say) and was stopped first; absent when there was none.
   */
  readonly leftoverStopped?: number;
  /** Stops the server (SIGTERM, then SIGKILL after 5 s). Safe to call twice. */
  stop(): Promise<void>;
  /** Kills the server at once, as a crash would, keeping its store. */
  kill(): Promise<void>;
  /** The last 32 KiB the server logged (its stderr), to say why it misbehaved. */
  recentLog(): string;
}

export async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const address = srv.address();
      srv.close(() => (typeof address === "object" && address ? resolvePort(address.port) : reject(new Error("no port"))));
    });
  });
}

/** Finds a nats-server binary: the option, `$BOXCAR_NATS_SERVER`, the repo's tools folder, then PATH. */
export function findNatsServer(binary?: string, env: NodeJS.ProcessEnv = process.env): string {
  const candidates = [binary, env.BOXCAR_NATS_SERVER, join(process.cwd(), ".boxcar", "tools", "bin", "nats-server"), repoTool()];
  for (const c of candidates) if (c && existsSync(c)) return c;
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    const p = join(dir, "nats-server");
    if (dir && existsSync(p)) return p;
  }
  throw new BoxcarError(
    ErrorCode.unavailable,
    "no nats-server found: run scripts/install-nats-server.sh, put nats-server >= 2.10 on PATH, or set BOXCAR_NATS_SERVER",
  );
}

/** `.boxcar/tools/bin/nats-server` at the root of the Boxcar checkout this file lives in. */
function repoTool(): string {
  return new URL("../../../.boxcar/tools/bin/nats-server", import.meta.url).pathname;
}

/** The `websocket` block: plain WebSocket, no compression, only `allowedOrigins` (a server cannot reload this block). */
function websocketBlock(ws: NatsWebsocketOptions): string {
  if (ws.allowedOrigins.length === 0) throw new RangeError("a WebSocket listener needs the page origins it allows");
  const origins = ws.allowedOrigins.map((o) => JSON.stringify(o)).join(", ");
  return `websocket { listen: ${JSON.stringify(`${ws.host}:${ws.port}`)}, no_tls: true, compression: false, allowed_origins: [${origins}] }`;
}

/** Starts a nats-server with JetStream and waits until it accepts connections. */
export async function startNatsServer(opts: NatsServerOptions = {}): Promise<NatsServer> {
  const binary = findNatsServer(opts.binary);
  const port = opts.port ?? (await freePort());
  const host = opts.host ?? "127.0.0.1";
  const ownStore = opts.storeDir === undefined;
  const storeDir = opts.storeDir ?? (await mkdtemp(join(tmpdir(), "boxcar-nats-")));
  await mkdir(storeDir, { recursive: true });
  const configFile = join(storeDir, "nats-server.conf");
  const pidFile = join(storeDir, "nats-server.pid");
  // A server left on this store by a launcher that died without stopping it would hold the
  // port and the store: stop it first.
  const leftoverStopped = ownStore ? undefined : await stopLeftover(pidFile, configFile);
  await writeFile(
    configFile,
    [
      `listen: ${JSON.stringify(`${host}:${port}`)}`,
      `pid_file: ${JSON.stringify(pidFile)}`,
      `server_name: ${JSON.stringify(opts.serverName ?? `boxcar-${port}`)}`,
      `jetstream { store_dir: ${JSON.stringify(join(storeDir, "jetstream"))}${opts.maxFileStore ? `, max_file_store: ${opts.maxFileStore}` : ""} }`,
      "max_payload: 1MB",
      opts.cluster ? clusterBlock(opts.cluster) : "",
      opts.websocket ? websocketBlock(opts.websocket) : "",
      opts.extraConfig ?? "",
    ].join("\n"),
  );
  if (!(await portIsFree(port))) {
    throw new BoxcarError(ErrorCode.unavailable, `port ${port} is already in use: stop what listens there or choose another port`);
  }
  // Its own process group: a Ctrl-C in the terminal reaches the CLI, which stops the server
  // last, after the workers and dispatcher have finished with it.
  const child = spawn(binary, ["-c", configFile], { stdio: ["ignore", "ignore", "pipe"], detached: true });
  const url = `nats://${host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host}:${port}`;
  let log = "";
  child.stderr?.setEncoding("utf8").on("data", (d: string) => {
    log = (log + d).slice(-32_768);
  });
  await waitReady(child);

  let stopped: Promise<void> | undefined;
  const stopWith = (signal: NodeJS.Signals, removeStore: boolean) =>
    (stopped ??= (async () => {
      await terminate(child, signal);
      if (removeStore && ownStore) await rm(storeDir, { recursive: true, force: true });
    })());
  return {
    url,
    port,
    storeDir,
    pid: child.pid ?? -1,
    ...(leftoverStopped !== undefined ? { leftoverStopped } : {}),
    stop: () => stopWith("SIGTERM", true),
    kill: () => stopWith("SIGKILL", false),
    recentLog: () => log,
    [Symbol.asyncDispose]: () => stopWith("SIGTERM", true),
  };
}

/**
 * Stops the server whose pid `pidFile` holds if it still runs with `configFile` (so not another
 * program that got the pid since); returns its pid, or undefined when there was none.
 */
async function stopLeftover(pidFile: string, configFile: string): Promise<number | undefined> {
  const pid = Number.parseInt(await readFile(pidFile, "utf8").catch(() => ""), 10);
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  const commandLine = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
  if (!commandLine.includes(configFile)) return undefined;
  for (const [signal, waitMs] of [
    ["SIGTERM", 10_000],
    ["SIGKILL", 5_000],
  ] as const) {
    try {
      process.kill(pid, signal);
    } catch {
      return pid; // gone already
    }
    for (let waited = 0; waited < waitMs; waited += 50) {
      if (!existsSync(`/proc/${pid}`)) return pid;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  throw new BoxcarError(ErrorCode.unavailable, `the nats-server left running on this store (pid ${pid}) does not stop`);
}

function clusterBlock(cluster: NatsClusterOptions): string {
  const routes = cluster.routes.map((r) => JSON.stringify(r)).join(", ");
  return `cluster { name: ${JSON.stringify(cluster.name)}, listen: "127.0.0.1:${cluster.port}", routes: [${routes}] }`;
}

/** Resolves when this server (not another one on the port) logs that it is ready. */
function waitReady(child: ChildProcess): Promise<void> {
  return new Promise((resolveReady, reject) => {
    let stderr = "";
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      done(new Error(`nats-server was not ready within 15 s: ${stderr}`));
    }, 15_000);
    const onExit = (code: number | null) => done(new Error(`nats-server exited with ${code}: ${stderr}`));
    const onData = (d: string) => {
      stderr = (stderr + d).slice(-8192);
      if (stderr.includes("Server is ready")) done();
    };
    const done = (err?: Error) => {
      clearTimeout(timer);
      child.off("exit", onExit);
      child.stderr?.off("data", onData);
      if (err) reject(err);
      else resolveReady();
    };
    child.once("exit", onExit);
    child.stderr?.on("data", onData);
  });
}

function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolveFree) => {
    const probe = createServer();
    probe.once("error", () => resolveFree(false));
    probe.listen(port, "127.0.0.1", () => probe.close(() => resolveFree(true)));
  });
}

async function terminate(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  child.kill(signal);
  const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
  await exited;
  clearTimeout(timer);
}
