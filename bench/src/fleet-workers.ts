/**
 * BENCH ONLY: one OS process holding `count` Boxcar workers, each on a NATS connection of its
 * own with its own presence, heartbeat and pull loops, as that many worker processes would.
 * Started by `fleet.ts`; prints `ready` once every worker pulls, and stops them all on SIGTERM.
 *
 * Arguments: URLS (comma-separated) PREFIX COUNT CONCURRENCY WORKSPACE (memory | spawn) TAG
 */
import { tmpdir } from "node:os";
import { openTopology } from "@boxcar/client";
import { createHostSandboxProvider, createWorker, type SandboxProvider, type Worker } from "@boxcar/worker";
import { connect } from "@nats-io/transport-node";
import { createInstantSandboxProvider } from "./instant-sandbox.js";

const [urls = "", prefix = "", count = "1", concurrency = "4", workspace = "memory", tag = "w"] = process.argv.slice(2);

const provider = (): SandboxProvider =>
  workspace === "spawn" ? createHostSandboxProvider({ root: tmpdir() }) : createInstantSandboxProvider("memory", tmpdir());

const workers: Worker[] = [];
for (let i = 0; i < Number(count); i++) {
  const nc = await connect({ servers: urls.split(","), name: `${tag}-${i}`, noAsyncTraces: true });
  const worker = createWorker({
    topology: await openTopology(nc, { prefix }),
    concurrency: Number(concurrency),
    providers: [provider()],
    workerId: `${tag}-${i}`,
  });
  void worker.run();
  workers.push(worker);
}
// A worker pulls once `accepting`; wait for all before saying so.
while (!workers.every((w) => w.accepting)) await new Promise((r) => setTimeout(r, 50));
process.stdout.write("ready\n");

process.once("SIGTERM", () => {
  void Promise.all(workers.map((w) => w.close())).then(() => process.exit(0));
});
