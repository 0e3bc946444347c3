/**
 * nats-core 3.4.0 ends every answered request with `RequestOne.cancel()`, which builds a
 * `RequestError("cancelled")` (an `Error`, with its stack) to reject a promise that is already
 * resolved. Boxcar patches that line (patches/@nats-io__nats-core@3.4.0.patch). This measures
 * the patch against the line as published, interleaved in one process on one connection:
 * `pnpm bench:request-errors`. It is also the reproduction for a report upstream.
 *
 * Environment: BENCH_N (requests per round, default 20000), BENCH_ROUNDS (default 4),
 * BENCH_IN_FLIGHT (default 64).
 */
import { startNatsServer } from "@boxcar/fabric";
import { RequestOne } from "@nats-io/nats-core/internal";
import { connect, type Msg, type NatsConnection } from "@nats-io/transport-node";
import { cpuPerJob, cpuSnapshot } from "./cpu.js";
import { saturate } from "./load.js";
import { envInt, table } from "./stats.js";

type Resolver = (this: RequestOne, err: Error | null, msg: Msg) => void;

const patched: Resolver = RequestOne.prototype.resolver;
/** The resolver as nats-core 3.4.0 publishes it: the same, then `cancel()`. */
const published: Resolver = function (this: RequestOne, err, msg) {
  patched.call(this, err, msg);
  this.cancel();
};

async function round(nc: NatsConnection, serverPid: number, requests: number, inFlight: number) {
  const before = cpuSnapshot(serverPid);
  const run = await saturate(() => nc.request("echo", "x", { timeout: 5_000 }).then(() => undefined), requests, inFlight);
  const cpu = cpuPerJob(before, cpuSnapshot(serverPid), requests);
  return { perSecond: run.jobsPerSecond, nodeUs: (cpu.nodeUserMs + cpu.nodeSystemMs) * 1000, otherCores: cpu.otherCores };
}

async function main(): Promise<void> {
  const requests = envInt("BENCH_N", 20_000);
  const rounds = envInt("BENCH_ROUNDS", 4);
  const inFlight = envInt("BENCH_IN_FLIGHT", 64);
  const server = await startNatsServer();
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  const responder = await connect({ servers: server.url });
  responder.subscribe("echo", {
    callback: (_err, msg) => {
      msg.respond("y");
    },
  });
  await responder.flush();
  const rows: string[][] = [["round", "resolver", "requests/s", "node CPU µs/request", "other CPUs"]];
  try {
    await round(nc, server.pid, requests, inFlight); // warm-up
    for (let r = 1; r <= rounds; r++) {
      for (const [name, resolver] of [
        ["as published", published],
        ["patched", patched],
      ] as const) {
        RequestOne.prototype.resolver = resolver;
        const result = await round(nc, server.pid, requests, inFlight);
        rows.push([String(r), name, result.perSecond.toFixed(0), result.nodeUs.toFixed(1), result.otherCores?.toFixed(2) ?? "-"]);
      }
    }
  } finally {
    RequestOne.prototype.resolver = patched;
    await nc.close();
    await responder.close();
    await server.stop();
  }
  console.log(`${requests} request/replies per round, ${inFlight} in flight, noAsyncTraces on (as Boxcar connects)`);
  console.log(table(rows));
}

await main();
