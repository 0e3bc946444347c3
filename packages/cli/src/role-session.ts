import type { ParseArgsConfig } from "node:util";
import { connectNats, createClient, type ResolvedConnection } from "@boxcar/client";
import type { Logger } from "@boxcar/common";
import { DEFAULT_STREAM_LIMITS, openTopology, patiently, type StreamLimits, type Topology } from "@boxcar/fabric";
import { parseSizeBytes } from "@boxcar/protocol";
import type { NatsConnection } from "@nats-io/transport-node";
import { type Session, sessionOf } from "./context.js";
import { UsageError } from "./usage-error.js";

// What the roles that create the system (`up`, `dispatcher`, `worker`) and `backup` share, apart
// from the client's session in context.ts: only they load @boxcar/fabric's topology.

/** A dispatcher's or worker's connection, with the streams and buckets it works on. */
export interface RoleSession extends Session {
  topology: Topology;
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
