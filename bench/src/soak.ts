/**
 * A soak (`pnpm bench:soak`): a steady load for BENCH_MINUTES (default 30) at BENCH_RATE jobs a
 * second (default 20), on one nats-server with the real `boxcar dispatcher` and workers in
 * processes of their own, with a retention of one minute and, besides a worker that stays, a
 * second worker process started and stopped every minute. Each job prints a line and writes
 * one artifact. Every 30 s it samples the JetStream store, the job records, and each process's
 * resident memory and open file descriptors. docs/benchmarks.md#soak has the figures.
 */
import { readdirSync, readFileSync } from "node:fs";
import { connectNats, createClient, resolveConnection } from "@boxcar/client";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { isTerminal, type JobRecord } from "@boxcar/protocol";
import { KvWatchInclude } from "@nats-io/kv";
import { startDispatcher, startWorkerHosts, type WorkerHosts } from "./separate-roles.js";
import { envInt, table } from "./stats.js";

const PREFIX = "soak";
const SAMPLE_MS = 30_000;
const log = (line: string) => process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const rss = (pid: number) => Number(readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/)?.[1] ?? 0) / 1024;
const fds = (pid: number) => readdirSync(`/proc/${pid}/fd`).length;

const minutes = envInt("BENCH_MINUTES", 30);
const rate = envInt("BENCH_RATE", 20);

await using server = await startNatsServer();
const dispatcher = await startDispatcher(server.url, PREFIX);
const stay = await startWorkerHosts({ url: server.url, prefix: PREFIX, workers: 1, perProcess: 1, concurrency: 8, sandbox: "host" });
const connection = resolveConnection({ flags: { nats: server.url }, env: {} });
const nc = await connectNats(connection, `${PREFIX}-load`);
const topology = await openTopology(nc, { prefix: PREFIX });
const client = createClient(topology, { identity: connection.identity });
let churn: WorkerHosts | undefined;
try {
  await client.applyAgent({
    name: "maker",
    command: ["sh", "-c", 'echo working; mkdir -p out; echo made > out/made.txt; printf \'{"output":1}\' > "$BOXCAR_RESULT_FILE"'],
    runtime: { sandbox: "host" },
    trusted: true,
  });
  await client.setPolicy({ retention: { jobs: "1m" } });

  const ended = { succeeded: 0, other: 0 };
  const watch = await topology.jobs.watch({ include: KvWatchInclude.UpdatesOnly });
  void (async () => {
    for await (const entry of watch) {
      if (entry.operation !== "PUT") continue;
      const state = entry.json<JobRecord>().state;
      if (!isTerminal(state)) continue;
      if (state === "succeeded") ended.succeeded += 1;
      else ended.other += 1;
    }
  })();

  const began = Date.now();
  const until = began + minutes * 60_000;
  let submitted = 0;
  let refused = 0;
  const load = (async () => {
    for (let tick = 0; Date.now() < until; tick++) {
      const due = began + (tick * 1000) / rate;
      if (due > Date.now()) await sleep(due - Date.now());
      submitted += 1;
      void client.submit({ agent: "maker", input: submitted }).catch(() => {
        refused += 1;
      });
    }
  })();
  const churning = (async () => {
    while (Date.now() < until - 60_000) {
      churn = await startWorkerHosts({ url: server.url, prefix: PREFIX, workers: 1, perProcess: 1, concurrency: 8, sandbox: "host" });
      await sleep(30_000);
      await churn.stop();
      churn = undefined;
      await sleep(30_000);
    }
  })();

  const rows: string[][] = [
    [
      "min",
      "submitted",
      "succeeded",
      "other",
      "records",
      "store MiB",
      "dispatcher MiB",
      "dispatcher fds",
      "worker MiB",
      "worker fds",
      "nats-server MiB",
    ],
  ];
  while (Date.now() < until + SAMPLE_MS) {
    await sleep(SAMPLE_MS);
    const account = await topology.jsm.getAccountInfo();
    const records = (await topology.jobs.status()).values;
    const workerPid = stay.pids[0] ?? 0;
    const row = [
      ((Date.now() - began) / 60_000).toFixed(1),
      String(submitted),
      String(ended.succeeded),
      String(ended.other + refused),
      String(records),
      (account.storage / 1024 ** 2).toFixed(1),
      rss(dispatcher.pid).toFixed(0),
      String(fds(dispatcher.pid)),
      rss(workerPid).toFixed(0),
      String(fds(workerPid)),
      rss(server.pid).toFixed(0),
    ];
    rows.push(row);
    log(row.join(" "));
  }
  await load;
  await churning;
  watch.stop();
  process.stdout.write(
    `\nSoak: ${minutes} min at ${rate} jobs/s, retention 1 min, a second worker started and stopped every minute\n${table(rows)}\n`,
  );
} finally {
  await churn?.stop();
  await stay.stop();
  await dispatcher.stop();
  await nc.close();
}
