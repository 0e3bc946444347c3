/**
 * How fast a submission past the system's queue limit is refused (`queue_full`), against an
 * admitted one, on one nats-server with a dispatcher and no worker: `pnpm bench:refusals`.
 * The queue limit is set to BENCH_QUEUED jobs (default 1000), the queue filled to it, then
 * BENCH_N refused submissions (default 2000) are timed one at a time, as a client retrying would
 * send them; then, with the limit raised, as many admitted ones of the same size. Last, on a
 * server whose JetStream store holds 24 MiB, submissions of 120 KB inputs until the store is
 * full, then BENCH_FULL_N (default 200) more, each refused with `storage_full`, timed.
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
    const full = await refusalsOnAFullStore(envInt("BENCH_FULL_N", 200));
    const rows = [["submission", "n", "p50", "p99", "max"]];
    for (const [name, samples] of [
      ["refused (queue_full)", refused],
      ["admitted", admitted],
      ["refused (storage_full), 120 KB input", full],
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

/** Fills a 24 MiB store with 120 KB submissions, then times `n` more, each refused with storage_full. */
async function refusalsOnAFullStore(n: number): Promise<number[]> {
  const MiB = 1024 ** 2;
  const server = await startNatsServer({ maxFileStore: 24 * MiB });
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  const topology = await openTopology(nc, { prefix: "full", streamLimits: { events: MiB, logs: MiB, dead: MiB, submit: MiB } });
  const dispatcher = await startDispatcher({ topology });
  const client = createClient(topology);
  const submit = (i: number) =>
    client.submit({ agent: "noop", input: { i, pad: "x".repeat(120_000) } }).then(
      () => undefined,
      (e: { code?: string }) => e,
    );
  try {
    await client.applyAgent({ name: "noop", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    let i = 0;
    while ((await submit(i++)) === undefined) if (i > 1_000) throw new Error("the store did not fill");
    const times: number[] = [];
    for (let k = 0; k < n; k++) {
      const start = performance.now();
      const err = await submit(i++);
      if (err?.code !== "storage_full") throw new Error(`expected storage_full, got ${err ? err.code : "an admission"}`);
      times.push(performance.now() - start);
    }
    return times;
  } finally {
    await dispatcher.close();
    await nc.close();
    await server.stop();
  }
}

await main();
