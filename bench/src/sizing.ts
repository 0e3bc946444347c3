/**
 * Sizing: what queued jobs take on a nats-server (`pnpm bench:sizing`). BENCH_JOBS no-op jobs
 * (default 10,000) with an input of BENCH_INPUT bytes (default 100) are submitted with no worker
 * running, so they stay queued; then the JetStream bytes of every stream and bucket, the store
 * folder on disk, and the memory of the server and of this process (dispatcher and client) are
 * read. Then a worker drains the queue and the same is read again: nothing is deleted yet, so
 * what remains is what finished jobs keep. docs/deploy.md#sizing has the figures.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { startNatsServer } from "@boxcar/fabric";
import { createWorker } from "@boxcar/worker";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { openBoxcarPath } from "./boxcar-path.js";
import { createInstantSandboxProvider } from "./instant-sandbox.js";
import { envInt, table } from "./stats.js";

const JOBS = envInt("BENCH_JOBS", 10_000);
const INPUT = envInt("BENCH_INPUT", 100);
const PREFIX = "sizing";
const log = (line: string) => process.stderr.write(`${line}\n`);
const mib = (bytes: number) => (bytes / 1024 ** 2).toFixed(1);

const rssOf = (pid: number) => Number(readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/)?.[1] ?? 0) * 1024;
const du = (dir: string) => Number(execFileSync("du", ["-sb", dir], { encoding: "utf8" }).split("\t")[0]);

await using server = await startNatsServer();
await using path = await openBoxcarPath({ url: server.url, prefix: PREFIX, providers: [], concurrency: 1, noWorker: true });
const admin = await connect({ servers: server.url });
const jsm = await jetstreamManager(admin);

/** Bytes and messages of every stream of this system, by name. */
async function streams(): Promise<Map<string, { bytes: number; messages: number }>> {
  const found = new Map<string, { bytes: number; messages: number }>();
  for await (const info of jsm.streams.list()) {
    if (!info.config.name.toLowerCase().includes(PREFIX)) continue;
    found.set(info.config.name, { bytes: info.state.bytes, messages: info.state.messages });
  }
  return found;
}

async function snapshot(label: string) {
  if (typeof globalThis.gc === "function") globalThis.gc();
  const byStream = await streams();
  const stored = [...byStream.values()].reduce((sum, s) => sum + s.bytes, 0);
  return { label, byStream, stored, disk: du(server.storeDir), serverRss: rssOf(server.pid), selfRss: process.memoryUsage().rss };
}

const empty = await snapshot("empty");
const input = "x".repeat(INPUT);
let next = 0;
const started = performance.now();
await Promise.all(
  Array.from({ length: 64 }, async () => {
    while (next < JOBS) await path.submit(next++, { input: { i: next, pad: input } });
  }),
);
log(`${JOBS} jobs submitted in ${((performance.now() - started) / 1000).toFixed(1)} s`);
const queued = await snapshot(`${JOBS} queued`);

await using connection = await connect({ servers: server.url });
const { openTopology } = await import("@boxcar/fabric");
const worker = createWorker({
  topology: await openTopology(connection, { prefix: PREFIX }),
  concurrency: 16,
  providers: [createInstantSandboxProvider("memory", tmpdir())],
});
void worker.run();
while ((await streams()).get("SIZING_WORK")?.messages) await new Promise((r) => setTimeout(r, 1_000));
await new Promise((r) => setTimeout(r, 3_000)); // the last final records
await worker.close();
const drained = await snapshot(`${JOBS} finished`);

const per10k = (bytes: number) => mib((bytes * 10_000) / JOBS);
console.log(`\nSizing: ${JOBS} no-op jobs with a ${INPUT}-byte input, one nats-server (1 replica)\n`);
console.log(
  table([
    ["state", "JetStream MiB", "disk MiB", "server RSS MiB", "dispatcher+client RSS MiB", "JetStream MiB per 10k"],
    ...[empty, queued, drained].map((s) => [
      s.label,
      mib(s.stored),
      mib(s.disk),
      mib(s.serverRss),
      mib(s.selfRss),
      per10k(s.stored - empty.stored),
    ]),
  ]),
);
console.log("\nBy stream (MiB: queued / finished)\n");
console.log(
  table([
    ["stream", "queued", "finished"],
    ...[...drained.byStream.keys()]
      .sort()
      .map((name) => [name, mib(queued.byStream.get(name)?.bytes ?? 0), mib(drained.byStream.get(name)?.bytes ?? 0)]),
  ]),
);
await admin.close();
