import { type NatsServer, openTopology, startNatsServer, type Topology, type TopologyOptions } from "@boxcar/client";
import { connect, type NatsConnection } from "@nats-io/transport-node";

let counter = 0;

/** A unique prefix per test, so tests sharing a server never see each other's jobs. */
export function uniquePrefix(): string {
  counter += 1;
  return `t${process.pid}x${counter}${Math.random().toString(36).slice(2, 6)}`;
}

export interface NatsFixture extends AsyncDisposable {
  readonly server: NatsServer;
  readonly url: string;
  readonly nc: NatsConnection;
  readonly topology: Topology;
  /** Another connection, e.g. for a second process role. */
  connect(): Promise<NatsConnection>;
}

/** A real nats-server on a free port with a temporary store, plus one open topology. */
export async function natsFixture(opts: TopologyOptions = {}): Promise<NatsFixture> {
  const server = await startNatsServer();
  const extra: NatsConnection[] = [];
  const nc = await connect({ servers: server.url, name: "test" });
  const topology = await openTopology(nc, { prefix: uniquePrefix(), ...opts });
  return {
    server,
    url: server.url,
    nc,
    topology,
    async connect() {
      const c = await connect({ servers: server.url, name: "test-extra" });
      extra.push(c);
      return c;
    },
    async [Symbol.asyncDispose]() {
      for (const c of [nc, ...extra]) await c.close().catch(() => {});
      await server.stop();
    },
  };
}
