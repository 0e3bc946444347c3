/**
 * BENCH ONLY: one OS process holding COUNT Boxcar workers (the real `createWorker`), each on a
 * NATS connection of its own, made as the CLI makes it, with its own presence, heartbeat and
 * pull loops: as that many `boxcar worker` processes would be, without a Node process each.
 * Started by `separate-roles.ts` over an IPC channel; it answers `stats` with what its workers'
 * connections sent and received so far, and stops its workers on `stop`.
 *
 * Arguments: URLS PREFIX COUNT CONCURRENCY SANDBOX TAG, where SANDBOX is `memory` (the agent
 * "runs" at once, no process, workspace in memory: `instant-sandbox.ts`) or `host` (the host
 * sandbox, which spawns the agent's command).
 */
import { tmpdir } from "node:os";
import { connectNats, resolveConnection } from "@boxcar/client";
import type { Logger } from "@boxcar/common";
import { openTopology } from "@boxcar/fabric";
import { createHostSandboxProvider, createWorker, type Worker } from "@boxcar/worker";
import type { NatsConnection } from "@nats-io/transport-node";
import { createInstantSandboxProvider } from "./instant-sandbox.js";

const [urls = "", prefix = "", count = "1", concurrency = "4", sandbox = "memory", tag = "w"] = process.argv.slice(2);

/** What the parent asks for. */
export type HostRequest = { type: "stats" } | { type: "stop" };

/** The answer to `stats`: counters since the process started, over all its workers. */
export interface HostStats {
  workers: number;
  /** Over the workers' connections, as nats.js counts them. */
  inMsgs: number;
  outMsgs: number;
  inBytes: number;
  outBytes: number;
  /** Pull requests sent. */
  pulls: number;
  /** Copies of work items (and bell rings) heard on the pool's subjects, and their payload bytes. */
  bells: number;
  bellBytes: number;
  /** What the workers logged as warnings or errors: how many, the first three and the latest. */
  warnings: number;
  warningSamples: string[];
}

/** Counted over every worker of this process. */
const counts = { pulls: 0, bells: 0, bellBytes: 0, warnings: 0 };
const warningSamples: string[] = [];

/** A logger that counts what the workers warn about (a silent worker would hide trouble). */
const countingLogger: Logger = {
  debug() {},
  info() {},
  warn(obj, msg) {
    counts.warnings += 1;
    // When (seconds since this process started) and what: the first few, and the latest.
    const line = `+${(performance.now() / 1000).toFixed(1)}s ${msg ?? ""}: ${String((obj as { err?: Error }).err?.message ?? "")}`;
    if (warningSamples.length < 3) warningSamples.push(line);
    else warningSamples[3] = `latest ${line}`;
  },
  error(obj, msg) {
    countingLogger.warn(obj, msg);
  },
  child: () => countingLogger,
};

/**
 * Counts, on one connection, the pull requests the worker sends and the "bells" it hears: the
 * copies of work items published to its pool (and `ctl.bell` rings) that reach plain
 * subscriptions, as idle workers before waiting pulls had; there should be none now. Pull
 * deliveries arrive on inboxes and are not counted as bells.
 */
function instrument(nc: NatsConnection): void {
  const publish = nc.publish.bind(nc);
  nc.publish = (subject, payload, opts) => {
    if (subject.startsWith("$JS.API.CONSUMER.MSG.NEXT.")) counts.pulls += 1;
    publish(subject, payload, opts);
  };
  const subscribe = nc.subscribe.bind(nc);
  nc.subscribe = (subject, opts) => {
    const callback = opts?.callback;
    if (!callback || !(subject.startsWith(`${prefix}.work.`) || subject.startsWith(`${prefix}.ctl.bell.`))) return subscribe(subject, opts);
    return subscribe(subject, {
      ...opts,
      callback: (err, msg) => {
        counts.bells += 1;
        counts.bellBytes += msg.data.length;
        callback(err, msg);
      },
    });
  };
}

const started = performance.now();
const connections: NatsConnection[] = [];
const workers: Worker[] = [];
const provider = () => (sandbox === "host" ? createHostSandboxProvider() : createInstantSandboxProvider("memory", tmpdir()));

process.on("message", async (request: HostRequest) => {
  if (request.type === "stats") {
    const stats: HostStats = { inMsgs: 0, outMsgs: 0, inBytes: 0, outBytes: 0, ...counts, warningSamples, workers: workers.length };
    for (const nc of connections) {
      const s = nc.stats();
      stats.inMsgs += s.inMsgs;
      stats.outMsgs += s.outMsgs;
      stats.inBytes += s.inBytes;
      stats.outBytes += s.outBytes;
    }
    process.send?.({ type: "stats", stats });
  } else if (request.type === "stop") {
    await Promise.all(workers.map((w) => w.close()));
    await Promise.all(connections.map((nc) => nc.close()));
    process.exit(0);
  }
});
// The bench went away: leave nothing behind.
process.on("disconnect", () => process.exit(1));

async function startOne(i: number): Promise<void> {
  const id = `${tag}-${i}`;
  const nc = await connectNats(resolveConnection({ flags: { nats: urls }, env: {} }), id);
  instrument(nc);
  connections.push(nc);
  const worker = createWorker({
    topology: await openTopology(nc, { prefix }),
    concurrency: Number(concurrency),
    providers: [provider()],
    workerId: id,
    logger: countingLogger,
  });
  workers.push(worker);
  void worker.run();
}

// Ten at a time: a hundred connections and topology opens at once would be a start-up storm.
for (let i = 0; i < Number(count); i += 10) {
  await Promise.all(Array.from({ length: Math.min(10, Number(count) - i) }, (_, j) => startOne(i + j)));
}
while (!workers.every((w) => w.accepting)) await new Promise((r) => setTimeout(r, 50));
process.send?.({ type: "ready", startMs: performance.now() - started });
