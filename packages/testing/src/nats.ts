import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { AuthDir } from "@boxcar/auth";
import { connectNats, resolveConnection } from "@boxcar/client";
import {
  type NatsServer,
  type NatsServerOptions,
  openTopology,
  startNatsServer,
  type Topology,
  type TopologyOptions,
  WorkSigner,
} from "@boxcar/fabric";
import { uniquePrefix } from "@boxcar/fabric/testing";
import type { NatsConnection } from "@nats-io/transport-node";
import { scratch } from "./scratch.js";

/** The auth folder of each fixture server, by URL: CLI runs against it log in with its credentials. */
const authByUrl = new Map<string, AuthDir>();

/** The credentials of the fixture server at `url` (while it runs), e.g. to run the `boxcar` command against it. */
export function authFor(url: string): AuthDir | undefined {
  return authByUrl.get(url);
}

export interface NatsFixture extends AsyncDisposable {
  readonly server: NatsServer;
  readonly url: string;
  /** The credentials the server runs with (`boxcar auth init`'s, for this fixture's prefix). */
  readonly auth: AuthDir;
  /** An admin's connection and topology: tests may read and write anything through them. */
  readonly nc: NatsConnection;
  readonly topology: Topology;
  /** What `startDispatcher` needs to run as the dispatcher role: its own connection and its signer. */
  readonly dispatcherRole: { topology: Topology; signer: WorkSigner };
  /** What `createWorker` needs to run as the worker role: its own connection, trusting the dispatcher's key. */
  readonly workerRole: { topology: Topology; dispatcherKeys: readonly string[] };
  /** Another admin connection, e.g. for a second process role. */
  connect(): Promise<NatsConnection>;
}

/**
 * A real nats-server on a free port with a temporary store, run with the config `boxcar auth
 * init` writes, so every test runs with authentication on and each role on its own credential.
 */
export async function natsFixture(
  opts: TopologyOptions = {},
  serverOpts: Pick<NatsServerOptions, "host" | "websocket" | "maxFileStore"> = {},
): Promise<NatsFixture> {
  const prefix = opts.prefix ?? uniquePrefix();
  const dir = await scratch("boxcar-auth-");
  const auth = await AuthDir.init(join(dir.path, "auth"), { prefix });
  const server = await startNatsServer({ ...serverOpts, extraConfig: await readFile(join(auth.dir, "auth.conf"), "utf8") });
  authByUrl.set(server.url, auth);
  const connections: NatsConnection[] = [];
  const connectAs = async (user: string) => {
    const connection = resolveConnection({ flags: { nats: server.url, creds: auth.credsFile(user) }, env: {} });
    const nc = await connectNats(connection, `test-${user}`);
    connections.push(nc);
    return { nc, connection };
  };
  const admin = await connectAs("admin");
  const topology = await openTopology(admin.nc, { ...opts, prefix });
  const dispatcher = await connectAs("dispatcher");
  const worker = await connectAs("worker");
  return {
    server,
    url: server.url,
    auth,
    nc: admin.nc,
    topology,
    dispatcherRole: {
      topology: await openTopology(dispatcher.nc, { ...opts, prefix }),
      signer: new WorkSigner(dispatcher.connection.seed as Uint8Array),
    },
    workerRole: { topology: await openTopology(worker.nc, { ...opts, prefix }), dispatcherKeys: auth.dispatcherKeys() },
    async connect() {
      return (await connectAs("admin")).nc;
    },
    async [Symbol.asyncDispose]() {
      for (const c of connections) await c.close().catch(() => {});
      authByUrl.delete(server.url);
      await server.stop();
      await dir[Symbol.asyncDispose]();
    },
  };
}
