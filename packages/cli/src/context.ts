import { existsSync } from "node:fs";
import { join } from "node:path";
import { type ParseArgsConfig, parseArgs } from "node:util";
import { type BoxcarClient, connectNats, createClient, type ResolvedConnection, resolveConnection } from "@boxcar/client";
import type { Logger } from "@boxcar/common";
import { DEFAULT_STREAM_LIMITS, openTopology, patiently, type StreamLimits, type Topology } from "@boxcar/fabric";
import { BoxcarError, type NatsConnectionSettings, names, parseSizeBytes } from "@boxcar/protocol";
import type { NatsConnection } from "@nats-io/transport-node";
import { UsageError } from "./usage-error.js";

export interface Io {
  /** Read only by commands that take data on stdin (`-`); absent in embedders that give none. */
  stdin?: NodeJS.ReadableStream;
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream;
  env: NodeJS.ProcessEnv;
  /** Aborted on SIGINT/SIGTERM (the binary wires it); long-running commands stop on it. */
  signal: AbortSignal;
}

/** Flags every command takes. */
export const globalOptions = {
  nats: { type: "string" },
  context: { type: "string" },
  creds: { type: "string" },
  nkey: { type: "string" },
  user: { type: "string" },
  password: { type: "string" },
  token: { type: "string" },
  "tls-cert": { type: "string" },
  "tls-key": { type: "string" },
  "tls-ca": { type: "string" },
  "tls-first": { type: "boolean" },
  prefix: { type: "string" },
  json: { type: "boolean", default: false },
  help: { type: "boolean", short: "h", default: false },
} as const satisfies ParseArgsConfig["options"];

export type OptionsConfig = NonNullable<ParseArgsConfig["options"]>;

/** A client's connection: it talks to the dispatchers' API only, and needs no JetStream access. */
export interface Session extends AsyncDisposable {
  nc: NatsConnection;
  client: BoxcarClient;
  /** How it connected, and who it asks as (`connection.identity`). */
  connection: ResolvedConnection;
}

/** A dispatcher's or worker's connection, with the streams and buckets it works on. */
export interface RoleSession extends Session {
  topology: Topology;
}

export interface CommandContext<V extends object> {
  values: V & { nats?: string; prefix?: string; json: boolean };
  positionals: string[];
  io: Io;
  /** Writes a line to stdout. */
  print(text: string): void;
  /** Connects to NATS as a client of the Boxcar system. */
  session(name?: string): Promise<Session>;
}

/** The connection flags given on the command line, in the shape of the worker config file's keys. */
export function connectionFlags(values: Record<string, unknown>): NatsConnectionSettings {
  const flags: Record<string, unknown> = {
    nats: values.nats,
    context: values.context,
    creds: values.creds,
    nkey: values.nkey,
    user: values.user,
    password: values.password,
    token: values.token,
    tlsCert: values["tls-cert"],
    tlsKey: values["tls-key"],
    tlsCa: values["tls-ca"],
    tlsFirst: values["tls-first"],
  };
  return Object.fromEntries(Object.entries(flags).filter(([, v]) => v !== undefined)) as NatsConnectionSettings;
}

/**
 * Resolves the connection settings; a bad one is a usage error naming it. With no credential
 * given anywhere, the admin credential `boxcar up --auth` made in this folder
 * (`$BOXCAR_AUTH_DIR`, else `.boxcar/auth`) is used when it is there.
 */
export function connectionFrom(
  values: Record<string, unknown>,
  env: NodeJS.ProcessEnv,
  file: NatsConnectionSettings = {},
): ResolvedConnection {
  try {
    const resolved = resolveConnection({ flags: connectionFlags(values), env, file });
    const s = resolved.settings;
    const local = join(env.BOXCAR_AUTH_DIR ?? join(".boxcar", "auth"), "admin.creds");
    const hasCredential = [s.creds, s.nkey, s.user, s.token, s.context].some((v) => v !== undefined);
    if (hasCredential || !existsSync(local)) return resolved;
    return resolveConnection({ flags: { ...connectionFlags(values), creds: local }, env, file });
  } catch (err) {
    if (err instanceof BoxcarError) throw new UsageError(err.message);
    throw err;
  }
}

/** `--replicas N`, taken by the roles that create the system (`up`, `dispatcher`, `worker`). */
const replicasOption = { replicas: { type: "string" } } as const satisfies ParseArgsConfig["options"];

/**
 * The replica count asked for: `--replicas`, else `$BOXCAR_REPLICAS`. Undefined when neither is
 * set: the topology then follows the NATS system (the existing system's count, else 3 on a
 * cluster of three or more servers, else 1).
 */
export function replicasFrom(flag: unknown, env: NodeJS.ProcessEnv): number | undefined {
  const [source, value] = flag !== undefined ? ["--replicas", String(flag)] : ["BOXCAR_REPLICAS", env.BOXCAR_REPLICAS];
  if (value === undefined || value.trim() === "") return undefined;
  const n = Number(value);
  if (n !== 1 && n !== 3 && n !== 5) throw new UsageError(`${source} must be 1, 3 or 5, got ${JSON.stringify(value)}`);
  return n;
}

/** `--stream-limits events=SIZE,logs=SIZE,dead=SIZE,submit=SIZE`, taken by the roles that create the system. */
const streamLimitsOption = { "stream-limits": { type: "string" } } as const satisfies ParseArgsConfig["options"];

/**
 * The history streams' sizes asked for: `--stream-limits`, else `$BOXCAR_STREAM_LIMITS`, as
 * `events=256Mi,logs=128Mi,dead=64Mi,submit=16Mi` (any of them). Undefined when neither is set.
 */
function streamLimitsFrom(flag: unknown, env: NodeJS.ProcessEnv): StreamLimits | undefined {
  const [source, value] = flag !== undefined ? ["--stream-limits", String(flag)] : ["BOXCAR_STREAM_LIMITS", env.BOXCAR_STREAM_LIMITS];
  if (value === undefined || value.trim() === "") return undefined;
  const limits: StreamLimits = {};
  for (const part of value.split(",")) {
    const [name = "", size = ""] = part.split("=").map((p) => p.trim());
    if (!(name in DEFAULT_STREAM_LIMITS)) {
      throw new UsageError(
        `${source}: ${JSON.stringify(name)} is not a stream with a limit; use ${Object.keys(DEFAULT_STREAM_LIMITS).join(", ")} (e.g. events=256Mi)`,
      );
    }
    const bytes = parseSizeBytes(size);
    if (bytes === undefined || bytes < 1024 ** 2) {
      throw new UsageError(`${source}: ${name}=${size} is not a size of at least 1Mi (e.g. ${name}=64Mi)`);
    }
    limits[name as keyof StreamLimits] = bytes;
  }
  return limits;
}

/** The flags of the roles that create the system: replicas, and what the history streams reserve. */
export const systemOptions = { ...replicasOption, ...streamLimitsOption } as const satisfies ParseArgsConfig["options"];

/** The system's shape from `--replicas` and `--stream-limits` (or their variables), as `openRoleSession` takes it. */
export function systemOptionsFrom(
  values: Record<string, unknown>,
  env: NodeJS.ProcessEnv,
): Pick<SessionTopologyOptions, "replicas" | "streamLimits"> {
  const replicas = replicasFrom(values.replicas, env);
  const streamLimits = streamLimitsFrom(values["stream-limits"], env);
  return { ...(replicas !== undefined ? { replicas } : {}), ...(streamLimits ? { streamLimits } : {}) };
}

/** What a role that creates the system may choose about it. */
export interface SessionTopologyOptions {
  replicas?: number;
  streamLimits?: StreamLimits;
  /** Called once connected, before the wait for JetStream: a health endpoint follows the connection from then on. */
  connected?: (nc: NatsConnection) => void;
  /** Aborted (SIGTERM) while it waits for JetStream: it stops waiting and throws the abort. */
  signal?: AbortSignal;
}

/** Connects as a client: names only, no streams or buckets. */
export async function openSession(connection: ResolvedConnection, prefix: string | undefined, name: string): Promise<Session> {
  const link = { nc: await connectNats(connection, name), names: names(prefix) };
  return sessionOf(link.nc, createClient(link, { identity: connection.identity }), connection);
}

/**
 * Connects as a role that works on the system's streams and buckets (a dispatcher, a worker, an
 * admin that starts them), making whatever is missing. Started while the cluster recovers (no
 * JetStream answer yet), it waits, saying so once in `log`, instead of exiting.
 */
export async function openRoleSession(
  connection: ResolvedConnection,
  prefix: string | undefined,
  name: string,
  log: Logger,
  topologyOptions: SessionTopologyOptions = {},
): Promise<RoleSession> {
  const nc = await connectNats(connection, name);
  topologyOptions.connected?.(nc);
  const options = {
    ...(prefix ? { prefix } : {}),
    ...(topologyOptions.replicas !== undefined ? { replicas: topologyOptions.replicas } : {}),
    ...(topologyOptions.streamLimits ? { streamLimits: topologyOptions.streamLimits } : {}),
  };
  let topology: Topology;
  try {
    topology = await patiently("the streams and buckets", () => openTopology(nc, options), log, topologyOptions.signal);
  } catch (err) {
    await nc.close();
    throw err;
  }
  return { ...sessionOf(nc, createClient(topology, { identity: connection.identity }), connection), topology };
}

function sessionOf(nc: NatsConnection, client: BoxcarClient, connection: ResolvedConnection): Session {
  return {
    nc,
    client,
    connection,
    [Symbol.asyncDispose]: async () => {
      await nc.drain().catch(() => nc.close());
    },
  };
}

export interface CommandLine {
  values: Record<string, string | boolean | (string | boolean)[] | undefined>;
  positionals: string[];
}

export function parseCommandLine(args: string[], options: OptionsConfig, usage: string): CommandLine {
  const all = { ...globalOptions, ...options };
  try {
    return parseArgs({ args: joinNegativeValues(args, all), options: all, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n\nusage: ${usage}`);
  }
}

/**
 * `args` with a negative number given to a value-taking long option (`--delay -5s`) joined to it
 * (`--delay=-5s`): the parser would take it for a flag, and say its option is missing a value,
 * where the value itself is what is wrong (and gets its own clear error).
 */
function joinNegativeValues(args: readonly string[], options: OptionsConfig): string[] {
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] as string;
    const next = args[i + 1];
    const name = arg.startsWith("--") && !arg.includes("=") ? arg.slice(2) : undefined;
    if (name !== undefined && options[name]?.type === "string" && next !== undefined && /^-\d/.test(next)) {
      out.push(`${arg}=${next}`);
      i++;
    } else out.push(arg);
  }
  return out;
}

/**
 * A role's start that SIGTERM (`signal`) cut short while it waited for JetStream: undefined, a
 * clean stop with nothing to hand back. Any other failure is thrown.
 */
export async function unlessStopped<T>(signal: AbortSignal, start: Promise<T>, log: Logger): Promise<T | undefined> {
  try {
    return await start;
  } catch (err) {
    if (!signal.aborted) throw err;
    log.info({}, "stopped before it started");
    return undefined;
  }
}

/** Runs `stop` once `signal` aborts, at once if it has already. */
export function onStop(signal: AbortSignal, stop: () => void): void {
  if (signal.aborted) stop();
  else signal.addEventListener("abort", stop, { once: true });
}
