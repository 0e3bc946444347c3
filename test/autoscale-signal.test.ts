import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, type Topology } from "@boxcar/fabric";
import { PRIORITIES, type Priority } from "@boxcar/protocol";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { afterAll, beforeAll, expect, test } from "vitest";
import { eventually } from "./helpers/cli.js";
import { type NatsCluster, natsCluster } from "./helpers/cluster.js";
import { uniquePrefix } from "./helpers/nats.js";

/**
 * What KEDA's nats-jetstream scaler computes for one consumer: it reads `/jsz?acc=...&consumers=true&config=true`
 * from the endpoint it is given, finds the server that leads the consumer (`cluster.leader`),
 * reads that server's own `/jsz`, and takes `num_pending + num_ack_pending` there.
 */
async function kedaLag(cluster: NatsCluster, account: string, stream: string, consumer: string): Promise<number> {
  interface Consumer {
    name: string;
    num_pending: number;
    num_ack_pending: number;
    cluster?: { leader?: string };
  }
  interface Jsz {
    account_details?: { name: string; stream_detail?: { name: string; consumer_detail?: Consumer[] }[] }[];
  }
  const read = async (endpoint: string): Promise<Consumer | undefined> => {
    const jsz = (await (await fetch(`${endpoint}/jsz?acc=${encodeURIComponent(account)}&consumers=true&config=true`)).json()) as Jsz;
    return jsz.account_details
      ?.find((a) => a.name === account)
      ?.stream_detail?.find((s) => s.name === stream)
      ?.consumer_detail?.find((c) => c.name === consumer);
  };
  const entry = [...cluster.monitors.values()][0] as string;
  const seen = await read(entry);
  const leader = seen?.cluster?.leader ? cluster.monitors.get(seen.cluster.leader) : undefined;
  const c = leader && leader !== entry ? await read(leader) : seen;
  return c ? c.num_pending + c.num_ack_pending : 0;
}

let cluster: NatsCluster;
let topology: Topology;
beforeAll(async () => {
  cluster = await natsCluster(3);
  topology = await openTopology(await cluster.connect("autoscale"), { prefix: uniquePrefix() });
}, 240_000); // natsCluster may start the cluster again
afterAll(async () => {
  await cluster?.[Symbol.asyncDispose]();
});

test("KEDA's lag per priority consumer rises with queued jobs, falls as a worker drains them, and reaches 0", async () => {
  const { names } = topology;
  await topology.ensurePoolConsumer("default");
  await using _dispatcher = await startDispatcher({ topology });
  const client = createClient(topology);
  await client.applyAgent({ name: "nap", command: "sleep 0.2", runtime: { sandbox: "host" }, trusted: true });
  const queued: Record<Priority, number> = { high: 5, normal: 10, low: 3 };
  for (const priority of PRIORITIES) {
    for (let i = 0; i < queued[priority]; i++) await client.submit({ agent: "nap", priority });
  }
  // No worker yet: the lag of each consumer is its queued jobs ("$G": the account of a server without authentication).
  const lags = async () =>
    Object.fromEntries(
      await Promise.all(
        PRIORITIES.map(async (p) => [p, await kedaLag(cluster, "$G", names.streams.work, names.poolConsumer("default", p))]),
      ),
    ) as Record<Priority, number>;
  await eventually(async () => {
    const now = await lags();
    return PRIORITIES.every((p) => now[p] === queued[p]) ? true : undefined;
  }, "the lag to count the queued jobs");

  const worker = createWorker({ topology, concurrency: 2, providers: [createHostSandboxProvider()], policy: { host: "always" } });
  void worker.run();
  const samples: number[] = [];
  try {
    await eventually(
      async () => {
        const now = await lags();
        samples.push(PRIORITIES.reduce((sum, p) => sum + now[p], 0));
        return samples.at(-1) === 0 ? true : undefined;
      },
      "the lag to reach 0",
      60_000,
    );
  } finally {
    await worker.close();
  }
  process.stdout.write(
    `autoscale signal: queued high 5, normal 10, low 3; summed lag while one worker (2 slots) drains: ${samples.join(" ")}\n`,
  );
  expect(samples[0]).toBeLessThanOrEqual(18);
  expect(samples.at(-1)).toBe(0);
  // It falls: never above an earlier sample by more than the jobs a sweep takes at once.
  for (let i = 1; i < samples.length; i++) expect(samples[i]).toBeLessThanOrEqual((samples[i - 1] as number) + 2);
  // Idle: it stays 0.
  expect(Object.values(await lags())).toEqual([0, 0, 0]);
}, 120_000);
