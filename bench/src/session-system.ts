import { type BoxcarClient, createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { createDockerSandboxProvider, createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { connect } from "@nats-io/transport-node";
import Docker from "dockerode";

/**
 * What the session benches run against: one nats-server, a dispatcher, a worker of host and
 * Docker sandboxes (4 at once) and a client, each on its own connection, under `prefix`. On a
 * server without authentication every client is the admin: it applies agents and opens host
 * sessions. `engine` is the Docker engine's info, for the bench's report.
 */
export async function openSessionSystem(prefix: string) {
  const engine = await new Docker().info();
  const nats = await startNatsServer();
  const connections = await Promise.all(["client", "dispatcher", "worker"].map((name) => connect({ servers: nats.url, name })));
  const [clientNc, dispatcherNc, workerNc] = connections as [(typeof connections)[0], (typeof connections)[0], (typeof connections)[0]];
  const dispatcher = await startDispatcher({ topology: await openTopology(dispatcherNc, { prefix }) });
  const workerTopology = await openTopology(workerNc, { prefix });
  const worker = createWorker({
    topology: workerTopology,
    concurrency: 4,
    providers: [createHostSandboxProvider(), createDockerSandboxProvider({ prefix, system: workerTopology.systemId })],
  });
  void worker.run();
  const client: BoxcarClient = createClient(await openTopology(clientNc, { prefix }));
  return {
    engine,
    client,
    async close(): Promise<void> {
      await worker.close();
      await dispatcher.close();
      for (const nc of connections) await nc.drain();
      await nats.stop();
    },
  };
}
