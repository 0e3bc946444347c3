/**
 * `@boxcar/fabric/testing`: the NATS fixture of the roles' own unit tests. Tests only: no module
 * of a package imports it (`.dependency-cruiser.cjs` checks), and it is not in fabric's main entry.
 *
 * It lives here, not in `@boxcar/testing`, because that package starts a dispatcher and a worker
 * (its `localSystem`) and so depends on both: a dispatcher or worker unit test importing it would
 * make a cycle of packages. This module needs nothing above fabric, so every package can use it;
 * `@boxcar/testing` builds its fixtures on the same `uniquePrefix`.
 */

import { connect, type NatsConnection } from "@nats-io/transport-node";
import { type NatsServer, type NatsServerOptions, startNatsServer } from "./nats-server.js";
import { openTopology, type Topology } from "./topology.js";
import type { TopologyOptions } from "./topology-options.js";

let counter = 0;

/** A prefix no other test of this process uses, so tests sharing a server never see each other's streams and buckets. */
export function uniquePrefix(): string {
  counter += 1;
  return `t${process.pid}x${counter}${Math.random().toString(36).slice(2, 6)}`;
}

/** A nats-server for one test file, without authentication, and a connection that may do anything on it. */
export interface NatsTestServer extends AsyncDisposable {
  readonly server: NatsServer;
  readonly url: string;
  readonly nc: NatsConnection;
  /** Opens a topology on `nc`, with a prefix of its own unless `opts.prefix` names one. */
  topology(opts?: TopologyOptions): Promise<Topology>;
  /** Closes the connection and stops the server (its temporary store removed). Safe to call twice. */
  close(): Promise<void>;
}

/** Starts a real nats-server on a free port with a temporary store, and connects to it. */
export async function natsTestServer(opts: NatsServerOptions = {}): Promise<NatsTestServer> {
  const server = await startNatsServer(opts);
  let nc: NatsConnection;
  try {
    nc = await connect({ servers: server.url });
  } catch (err) {
    await server.stop();
    throw err;
  }
  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= nc
      .close()
      .catch(() => {})
      .then(() => server.stop());
    return closed;
  };
  return {
    server,
    url: server.url,
    nc,
    topology: (topologyOpts = {}) => openTopology(nc, { ...topologyOpts, prefix: topologyOpts.prefix ?? uniquePrefix() }),
    close,
    [Symbol.asyncDispose]: close,
  };
}
