/**
 * How fast a submission past the system's queue limit is refused (`queue_full`), against an
 * admitted one, on one nats-server with a dispatcher and no worker: `pnpm bench:refusals`.
 * The queue limit is set to BENCH_QUEUED jobs (default 1000), the queue filled to it, then
 * BENCH_N refused submissions (default 2000) are timed one at a time, as a client retrying would
 * send them; then, with the limit raised, as many admitted ones of the same size.
 */
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { connect } from "@nats-io/transport-node";
import { envInt, ms, summarize, table } from "./stats.js";

async function main(): Promise<void> {
  const queued = envInt("BENCH_QUEUED", 1_000);
  const n = envInt("BENCH_N", 2_000);
  const server = await startNatsServer();
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  const topology = await openTopology(nc, { prefix: "bench" });
  const dispatcher = await startDispatcher({ topology });
  const client = createClient(topology);
  try {
    await client.applyAgent({ name: "noop", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    await client.setPolicy({ queue: { jobs: queued } });
    for (let i = 0; i < queued; i++) await client.submit({ agent: "noop", input: { i } });
    const refused: number[] = [];
    for (let i = 0; i < n; i++) {
      const start = performance.now();
      const err = await client.submit({ agent: "noop", input: { i } }).then(
        () => undefined,
        (e: { code?: string }) => e,
      );
      if (err?.code !== "queue_full") throw new Error(`expected queue_full, got ${err ? err.code : "an admission"}`);
      refused.push(performance.now() - start);
    }
    await client.setPolicy({ queue: { jobs: queued + n + 10 } });
    const admitted: number[] = [];
    for (let i = 0; i < n; i++) {
      const start = performance.now();
      await client.submit({ agent: "noop", input: { i } });
      admitted.push(performance.now() - start);
    }
    const rows = [["submission", "n", "p50", "p99", "max"]];
    for (const [name, samples] of [
      ["refused (queue_full)", refused],
      ["admitted", admitted],
    ] as const) {
      const s = summarize(samples);
      rows.push([name, String(samples.length), ms(s.p50), ms(s.p99), ms(s.max)]);
    }
    process.stdout.write(`${table(rows)}\n`);
  } finally {
    await dispatcher.close();
    await nc.close();
    await server.stop();
  }
}

await main();
