import { type ParseArgsConfig, parseArgs } from "node:util";
import { type BoxcarClient, createClient, openTopology, type Topology } from "@boxcar/client";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { UsageError } from "./usage-error.js";

export interface Io {
  stdout: NodeJS.WritableStream;
  stderr: NodeJS.WritableStream;
  env: NodeJS.ProcessEnv;
  /** Aborted on SIGINT/SIGTERM (the binary wires it); long-running commands stop on it. */
  signal: AbortSignal;
}

/** Flags every command takes. */
export const globalOptions = {
  nats: { type: "string" },
  prefix: { type: "string" },
  json: { type: "boolean", default: false },
  help: { type: "boolean", short: "h", default: false },
} as const satisfies ParseArgsConfig["options"];

export type OptionsConfig = NonNullable<ParseArgsConfig["options"]>;

export interface Session extends AsyncDisposable {
  nc: NatsConnection;
  topology: Topology;
  client: BoxcarClient;
}

export interface CommandContext<V extends object> {
  values: V & { nats?: string; prefix?: string; json: boolean };
  positionals: string[];
  io: Io;
  /** Writes a line to stdout. */
  print(text: string): void;
  /**
   * Connects to NATS and opens the Boxcar system. Only the roles that own it (`create`) make
   * streams and buckets; other commands fail clearly when the system is not there.
   */
  session(name?: string, opts?: { create?: boolean }): Promise<Session>;
}

export function natsUrl(flag: string | undefined, env: NodeJS.ProcessEnv): string {
  return flag ?? env.BOXCAR_NATS_URL ?? "nats://127.0.0.1:4222";
}

export async function openSession(url: string, prefix: string | undefined, name: string, create: boolean): Promise<Session> {
  let nc: NatsConnection;
  try {
    // No async stack traces: nats.js builds one per request, a large share of a busy worker's CPU.
    nc = await connect({ servers: url, name, maxReconnectAttempts: -1, noAsyncTraces: true });
  } catch (cause) {
    throw new BoxcarError(
      ErrorCode.unavailable,
      `cannot reach NATS at ${url}: ${(cause as Error).message} (set --nats or BOXCAR_NATS_URL; \`boxcar up\` starts a local one)`,
      {
        cause,
      },
    );
  }
  let topology: Topology;
  try {
    topology = await openTopology(nc, { ...(prefix ? { prefix } : {}), create });
  } catch (err) {
    await nc.close();
    throw err;
  }
  return {
    nc,
    topology,
    client: createClient(topology),
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
  try {
    return parseArgs({ args, options: { ...globalOptions, ...options }, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n\nusage: ${usage}`);
  }
}
