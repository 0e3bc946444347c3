import { existsSync } from "node:fs";
import { join } from "node:path";
import { type BoxcarClient, connectNats, createClient, type ResolvedConnection, resolveConnection } from "@boxcar/client";
import { BoxcarError, type NatsConnectionSettings, names } from "@boxcar/protocol";
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

/** A client's connection: it talks to the dispatchers' API only, and needs no JetStream access. */
export interface Session extends AsyncDisposable {
  nc: NatsConnection;
  client: BoxcarClient;
  /** How it connected, and who it asks as (`connection.identity`). */
  connection: ResolvedConnection;
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

/** Connects as a client: names only, no streams or buckets. */
export async function openSession(connection: ResolvedConnection, prefix: string | undefined, name: string): Promise<Session> {
  const link = { nc: await connectNats(connection, name), names: names(prefix) };
  return sessionOf(link.nc, createClient(link, { identity: connection.identity }), connection);
}

export function sessionOf(nc: NatsConnection, client: BoxcarClient, connection: ResolvedConnection): Session {
  return {
    nc,
    client,
    connection,
    [Symbol.asyncDispose]: async () => {
      await nc.drain().catch(() => nc.close());
    },
  };
}
