/**
 * What deleting ended jobs frees, and how fast: `pnpm bench:retention`. One nats-server, a
 * dispatcher and a worker (host sandbox, 16 slots) in this process. BENCH_N jobs (default 2000)
 * with a BENCH_INPUT_BYTES input (default 1000) each run an agent that prints a line and writes
 * a small artifact; then `jobs.clean` deletes every ended job, as an admin's
 * `boxcar clean --older-than 0s` would, and the JetStream store is read before and after.
 */
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { connect } from "@nats-io/transport-node";
import { envInt, table } from "./stats.js";

async function main(): Promise<void> {
  const n = envInt("BENCH_N", 2_000);
  const inputBytes = envInt("BENCH_INPUT_BYTES", 1_000);
  const server = await startNatsServer();
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  const topology = await openTopology(nc, { prefix: "bench" });
  const dispatcher = await startDispatcher({ topology });
  const worker = createWorker({ topology, concurrency: 16, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(topology);
  const stored = async () => (await topology.jsm.getAccountInfo()).storage;
  try {
    await client.applyAgent({
      name: "maker",
      command: ["sh", "-c", 'echo working; mkdir -p out; echo made > out/made.txt; printf \'{"output":1}\' > "$BOXCAR_RESULT_FILE"'],
      trusted: true,
      runtime: { sandbox: "host" },
    });
    const empty = await stored();
    const pad = "x".repeat(inputBytes);
    const ids: string[] = [];
    for (let i = 0; i < n; i++) ids.push((await client.submit({ agent: "maker", input: { i, pad } })).job.id);
    for (const id of ids) {
      const job = await client.waitForJob(id);
      if (job.state !== "succeeded") throw new Error(`job ${id} ended ${job.state}`);
    }
    // Let the last events and records settle into the store.
    await new Promise((r) => setTimeout(r, 2_000));
    const full = await stored();
    const start = performance.now();
    let deleted = 0;
    for (let more = true; more; ) {
      const reply = await client.cleanJobs({ olderThan: 0 });
      deleted += reply.deleted;
      more = reply.more && reply.deleted > 0;
    }
    const seconds = (performance.now() - start) / 1000;
    const after = await stored();
    const kib = (bytes: number) => `${(bytes / 1024).toFixed(1)} KiB`;
    process.stdout.write(
      `${table([
        ["jobs", "input", "stored before", "per job", "after clean", "left per job", "deleted", "deleted/s"],
        [
          String(n),
          `${inputBytes} B`,
          `${((full - empty) / 1024 ** 2).toFixed(1)} MiB`,
          kib((full - empty) / n),
          `${((after - empty) / 1024 ** 2).toFixed(2)} MiB`,
          `${((after - empty) / n).toFixed(0)} B`,
          String(deleted),
          (deleted / seconds).toFixed(0),
        ],
      ])}\n`,
    );
  } finally {
    await worker.close();
    await dispatcher.close();
    await nc.close();
    await server.stop();
  }
}

await main();
