/**
 * Memory with many jobs queued (`pnpm bench:memory`): the real `boxcar dispatcher` and a worker
 * process, each on its own, on one nats-server. The worker (1 slot, host sandbox) is kept busy
 * by one long job, so every no-op job submitted after it stays queued. At each checkpoint
 * (default 1 000, 10 000 and 100 000 queued; BENCH_CHECKPOINTS, comma-separated) the resident
 * memory of the dispatcher, the worker and nats-server is read after the roles settle. Then a
 * second dispatcher is started against the full queue: how long it takes to be ready, and to
 * count every job (its start reads every record: queued jobs are not in the job index's
 * snapshots), and what it holds then. docs/benchmarks.md#memory-with-jobs-queued
 * has the figures.
 */
import { readFileSync } from "node:fs";
import { connectNats, createClient, resolveConnection } from "@boxcar/client";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { type RoleProcess, startDispatcher, startWorkerHosts } from "./separate-roles.js";
import { table } from "./stats.js";

const CHECKPOINTS = (process.env.BENCH_CHECKPOINTS ?? "1000,10000,100000").split(",").map(Number);
const SETTLE_MS = 5_000;
const PREFIX = "memory";
const log = (line: string) => process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);
const mib = (bytes: number) => (bytes / 1024 ** 2).toFixed(1);
const rssOf = (pid: number) => Number(readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/)?.[1] ?? 0) * 1024;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

await using server = await startNatsServer();
const dispatcher = await startDispatcher(server.url, PREFIX);
const worker = await startWorkerHosts({ url: server.url, prefix: PREFIX, workers: 1, perProcess: 1, concurrency: 1, sandbox: "host" });
const connection = resolveConnection({ flags: { nats: server.url }, env: {} });
const nc = await connectNats(connection, `${PREFIX}-submitter`);
const topology = await openTopology(nc, { prefix: PREFIX });
const client = createClient(topology, { identity: connection.identity });
const roles: RoleProcess[] = [dispatcher];
try {
  const agent = { runtime: { sandbox: "host" as const }, trusted: true };
  await client.applyAgent({ name: "blocker", command: ["sleep", "3600"], ...agent });
  await client.applyAgent({ name: "noop", command: ["true"], ...agent });
  // Room for every checkpoint: the system's default queue limit is 100 000 jobs and 256 MiB.
  // Records of about 340 bytes: a megabyte a thousand jobs is room enough.
  const most = Math.max(...CHECKPOINTS);
  await client.setPolicy({ queue: { jobs: most + 10, bytes: `${Math.max(256, Math.ceil(most / 1000))}Mi` } });
  const blocker = (await client.submit({ agent: "blocker", input: null })).job.id;
  while ((await client.getJob(blocker)).state !== "running") await sleep(100);

  const rows: string[][] = [["jobs queued", "dispatcher RSS MiB", "worker RSS MiB", "nats-server RSS MiB", "submitted/s"]];
  const measure = (label: string) => [label, mib(rssOf(dispatcher.pid)), mib(rssOf(worker.pids[0] ?? 0)), mib(rssOf(server.pid))];
  await sleep(SETTLE_MS);
  rows.push([...measure("0"), "-"]);
  const at: { queued: number; dispatcher: number; worker: number }[] = [];
  let submitted = 0;
  for (const checkpoint of CHECKPOINTS) {
    const started = performance.now();
    const from = submitted;
    await Promise.all(
      Array.from({ length: 64 }, async () => {
        while (submitted < checkpoint) {
          submitted += 1;
          await client.submit({ agent: "noop", input: submitted });
        }
      }),
    );
    const perSecond = (submitted - from) / ((performance.now() - started) / 1000);
    log(`${submitted} queued`);
    await sleep(SETTLE_MS);
    rows.push([...measure(String(submitted)), perSecond.toFixed(0)]);
    at.push({ queued: submitted, dispatcher: rssOf(dispatcher.pid), worker: rssOf(worker.pids[0] ?? 0) });
  }
  const blockerState = (await client.getJob(blocker)).state;
  if (blockerState !== "running") throw new Error(`the blocking job is ${blockerState}: the queue was not held`);

  // The first goes, so that the second answers every count (they share the API's queue group).
  await dispatcher.stop();
  roles.splice(roles.indexOf(dispatcher), 1);
  const restartedAt = performance.now();
  const second = await startDispatcher(server.url, PREFIX);
  roles.push(second);
  const readyMs = performance.now() - restartedAt;
  // Counted: its index has every job (the running one too), its start's reading over.
  while ((await client.countJobs().catch(() => ({ total: 0 }))).total < submitted + 1) await sleep(100);
  const countedMs = performance.now() - restartedAt;
  await sleep(SETTLE_MS);
  const secondRss = rssOf(second.pid);

  const first = at[0];
  const last = at.at(-1);
  const perJob = (key: "dispatcher" | "worker") =>
    first && last && last.queued > first.queued ? ((last[key] - first[key]) / (last.queued - first.queued)).toFixed(0) : "-";
  console.log(`\nMemory with jobs queued: ${submitted} no-op jobs behind one running job, one nats-server\n`);
  console.log(table(rows));
  console.log(
    `\nGrowth from ${first?.queued} to ${last?.queued} queued: dispatcher ${perJob("dispatcher")} B/job, worker ${perJob("worker")} B/job`,
  );
  console.log(
    `A second dispatcher, started with ${submitted} queued once the first had stopped: ready in ${(readyMs / 1000).toFixed(1)} s, ` +
      `counting every job in ${(countedMs / 1000).toFixed(1)} s, RSS ${mib(secondRss)} MiB`,
  );
} finally {
  await nc.close();
  await Promise.all(roles.map((r) => r.stop()));
  await worker.stop();
}
