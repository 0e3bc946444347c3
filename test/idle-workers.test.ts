import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology } from "@boxcar/fabric";
import { type JobRecord, PRIORITIES } from "@boxcar/protocol";
import { eventually, natsCluster, uniquePrefix } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker, type Worker } from "@boxcar/worker";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { expect, test } from "vitest";
import { noting } from "./helpers/noting.js";

const WORKERS = 4;
/** How soon a worker must notice that the server holding its waiting pulls is gone: the bound. */
const NOTICE_MS = 30_000;

test("idle workers whose pool consumers' leader is killed still run a job of each priority submitted afterwards, each within 30 s", async () => {
  await using cluster = await natsCluster(3);
  const prefix = uniquePrefix();
  const setup = await cluster.connect("setup");
  const setupTopology = await openTopology(setup, { prefix });
  await setupTopology.ensurePoolConsumer("default");
  const { jsm, names } = setupTopology;
  // The server that leads the pool's `normal` consumer goes; the roles connect only to another one,
  // so they never reconnect: only the consumer's waiting pulls are lost, not their connections.
  const leader = (await jsm.consumers.info(names.streams.work, names.poolConsumer("default", "normal"))).cluster?.leader ?? "";
  const victim = Number(/-n(\d+)$/.exec(leader)?.[1]);
  expect(victim, `leader ${leader}`).toBeGreaterThanOrEqual(0);
  const survivor = cluster.urls[(victim + 1) % cluster.urls.length] as string;
  const connections: NatsConnection[] = [];
  const onSurvivor = async (name: string) => {
    const nc = await connect({ servers: survivor, name, ignoreClusterUpdates: true, maxReconnectAttempts: -1 });
    connections.push(nc);
    return openTopology(nc, { prefix });
  };

  const said: string[] = [];
  const workers: Worker[] = [];
  const topology = await onSurvivor("dispatcher");
  const dispatcher = await startDispatcher({ topology });
  try {
    const client = createClient(topology);
    await client.applyAgent({ name: "idle-pickup", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    for (let i = 0; i < WORKERS; i++) {
      const worker = createWorker({
        topology: await onSurvivor(`worker-${i}`),
        providers: [createHostSandboxProvider()],
        concurrency: 1,
        logger: noting(said),
      });
      workers.push(worker);
      void worker.run();
    }
    await eventually(async () => (workers.every((w) => w.accepting) ? true : undefined), "the workers to start");
    // Idle, with their waiting pulls held by the consumers' leaders.
    const idle = await client.submit({ agent: "idle-pickup" });
    expect((await client.waitForJob(idle.job.id)).state).toBe("succeeded");
    await new Promise((r) => setTimeout(r, 1_000));

    await cluster.kill(victim);
    for (const priority of PRIORITIES) {
      // The submit waits out the streams' elections (the dispatcher retries); the worker's part starts once it is queued.
      const { job } = await eventually(() => client.submit({ agent: "idle-pickup", priority }).catch(() => undefined), "a submit", 60_000);
      const ended = await Promise.race([
        client.waitForJob(job.id),
        new Promise<JobRecord>((_, reject) =>
          setTimeout(
            () => reject(new Error(`${priority} job not run within ${NOTICE_MS} ms; workers said: ${said.join("; ")}`)),
            NOTICE_MS,
          ),
        ),
      ]);
      expect([priority, ended.state]).toEqual([priority, "succeeded"]);
    }
  } finally {
    await Promise.all(workers.map((w) => w.close()));
    await dispatcher.close();
    for (const nc of connections) await nc.close().catch(() => {});
  }
}, 240_000); // natsCluster may start the cluster again
