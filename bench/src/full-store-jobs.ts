/**
 * Jobs on a store that fills under them (issue 44's scenario): `pnpm bench:full-store`. One
 * nats-server whose JetStream store holds BENCH_STORE_MIB (default 40) MiB, a dispatcher, one
 * worker (4 at once) and a 1-hour retention. Four submitters send jobs of 100 KB inputs, each
 * of which stores a 150 KB artifact, until the store refuses them (`storage_full`); once the
 * jobs' states stop changing, one `clean` deletes the ended jobs, and the states are counted
 * again once they stop changing; then a second `clean`, and a last count. Each count says how
 * many jobs succeeded, failed (and with what), and are still queued or running.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { connect } from "@nats-io/transport-node";
import { envInt } from "./stats.js";

const MiB = 1024 ** 2;
/** How long the jobs' states must stay the same to count as settled. */
const SETTLED_MS = envInt("BENCH_SETTLED_MS", 20_000);

async function main(): Promise<void> {
  const server = await startNatsServer({ maxFileStore: envInt("BENCH_STORE_MIB", 40) * MiB });
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  const workerNc = await connect({ servers: server.url, noAsyncTraces: true });
  const streamLimits = { events: MiB, logs: MiB, dead: MiB, submit: MiB };
  const topology = await openTopology(nc, { prefix: "bench", streamLimits });
  const dispatcher = await startDispatcher({ topology, retentionIntervalMs: 3_600_000 });
  const worker = createWorker({
    topology: await openTopology(workerNc, { prefix: "bench", streamLimits }),
    concurrency: 4,
    providers: [createHostSandboxProvider()],
  });
  void worker.run();
  const client = createClient(topology);
  try {
    await client.setPolicy({ retention: { jobs: "1h" } });
    await client.applyAgent({
      name: "maker",
      trusted: true,
      runtime: { sandbox: "host" },
      outputs: ["out/**"],
      command: [
        "sh",
        "-c",
        'echo making; mkdir -p out; head -c 150000 /dev/urandom > out/a.bin; echo \'{"output":"ok"}\' > "$BOXCAR_RESULT_FILE"',
      ],
    });
    const pad = "x".repeat(100_000);
    const ids: string[] = [];
    await Promise.all(
      Array.from({ length: 4 }, async (_, s) => {
        for (let i = 0; ; i++) {
          try {
            ids.push((await client.submit({ agent: "maker", input: { s, i, pad } })).job.id);
          } catch (err) {
            if ((err as { code?: string }).code === "storage_full") return;
            throw err;
          }
        }
      }),
    );
    process.stdout.write(`submitted ${ids.length} jobs until the store refused them\n`);
    const report = async (when: string) => process.stdout.write(`${when}: ${JSON.stringify(await settled(client))}\n`);
    await report("settled");
    for (const n of [1, 2]) {
      const cleaned = await client.cleanJobs({ olderThan: 0 });
      process.stdout.write(`clean ${n}: deleted ${cleaned.deleted}, kept ${cleaned.kept}\n`);
      await report(`after clean ${n}`);
    }
  } finally {
    await worker.close();
    await dispatcher.close();
    await workerNc.close();
    await nc.close();
    await server.stop();
  }
}

/**
 * How many jobs are in each state once the counts have stayed the same for `SETTLED_MS` (states
 * with none left out), and why those that failed did.
 */
async function settled(client: ReturnType<typeof createClient>): Promise<Record<string, number>> {
  let last = "";
  let since = Date.now();
  for (;;) {
    const { counts } = await client.countJobs();
    const now = JSON.stringify(Object.fromEntries(Object.entries(counts).filter(([, n]) => n > 0)));
    if (now !== last) {
      last = now;
      since = Date.now();
    } else if (Date.now() - since >= SETTLED_MS) {
      const failed: Record<string, number> = {};
      for (let after: string | undefined; ; ) {
        const page = await client.listJobs({ state: "failed", limit: 20, ...(after ? { after } : {}) });
        for (const job of page.jobs) failed[`failed: ${job.error?.code}`] = (failed[`failed: ${job.error?.code}`] ?? 0) + 1;
        if (!page.next) break;
        after = page.next;
      }
      return { ...(JSON.parse(now) as Record<string, number>), ...failed };
    }
    await sleep(2_000);
  }
}

await main();
