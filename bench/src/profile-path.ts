/**
 * Where the job path's CPU goes: `pnpm bench:profile` runs the no-spawn path (memory workspace,
 * the roles and the submitter in this process, one nats-server) at saturation under Node's CPU
 * profiler, and prints the self time by package and the top functions. BENCH_M jobs (default
 * 5 000), BENCH_IN_FLIGHT in flight (default 64), after BENCH_WARMUP (default 500).
 */

import { writeFile } from "node:fs/promises";
import { Session } from "node:inspector/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startNatsServer } from "@boxcar/fabric";
import { openBoxcarPath } from "./boxcar-path.js";
import { createInstantSandboxProvider } from "./instant-sandbox.js";
import { saturate } from "./load.js";
import { envInt, table } from "./stats.js";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
  children?: number[];
}

/** The package (or part of Node) a script URL belongs to. */
function packageOf(url: string): string {
  if (url === "") return "(native, GC, idle)";
  if (url.startsWith("node:")) return "node:*";
  const boxcar = url.match(/\/packages\/([^/]+)\/dist\//);
  if (boxcar) return `@boxcar/${boxcar[1]}`;
  const dep = url.match(/node_modules\/\.pnpm\/[^/]+\/node_modules\/((?:@[^/]+\/)?[^/]+)/);
  if (dep) return dep[1] as string;
  if (url.includes("/bench/dist/")) return "(the bench)";
  return url;
}

async function main(): Promise<void> {
  const jobs = envInt("BENCH_M", 5000);
  const inFlight = envInt("BENCH_IN_FLIGHT", 64);
  const warmup = envInt("BENCH_WARMUP", 500);
  const server = await startNatsServer();
  const root = tmpdir();
  try {
    await using path = await openBoxcarPath({
      url: server.url,
      prefix: "profile",
      providers: [createInstantSandboxProvider("memory", root)],
      concurrency: 64,
      connectOptions: { noAsyncTraces: true },
    });
    await saturate(path.run, warmup, inFlight);
    const session = new Session();
    session.connect();
    await session.post("Profiler.enable");
    await session.post("Profiler.setSamplingInterval", { interval: 200 });
    await session.post("Profiler.start");
    const started = performance.now();
    await saturate(path.run, jobs, inFlight, warmup);
    const seconds = (performance.now() - started) / 1000;
    const { profile } = await session.post("Profiler.stop");
    session.disconnect();
    const file = join(tmpdir(), `boxcar-path-${Date.now()}.cpuprofile`);
    await writeFile(file, JSON.stringify(profile));

    const nodes = profile.nodes as ProfileNode[];
    const total = nodes.reduce((sum, n) => sum + (n.hitCount ?? 0), 0);
    const byPackage = new Map<string, number>();
    const byFunction = new Map<string, number>();
    for (const n of nodes) {
      const hits = n.hitCount ?? 0;
      if (hits === 0) continue;
      const pkg = packageOf(n.callFrame.url);
      byPackage.set(pkg, (byPackage.get(pkg) ?? 0) + hits);
      const fn = `${n.callFrame.functionName || "(anonymous)"} ${pkg}:${n.callFrame.url.split("/").pop()}:${n.callFrame.lineNumber + 1}`;
      byFunction.set(fn, (byFunction.get(fn) ?? 0) + hits);
    }
    const share = (hits: number) => `${((100 * hits) / total).toFixed(1)}%`;
    const top = (m: Map<string, number>, k: number) => [...m].sort((a, b) => b[1] - a[1]).slice(0, k);
    process.stdout.write(
      `${jobs} jobs at ${inFlight} in flight in ${seconds.toFixed(1)} s (${(jobs / seconds).toFixed(0)} jobs/s), profile ${file}\n\n` +
        `${table([["self time by package", "share"], ...top(byPackage, 15).map(([k, v]) => [k, share(v)])])}\n\n` +
        `${table([["function (self time)", "share"], ...top(byFunction, 30).map(([k, v]) => [k, share(v)])])}\n`,
    );
  } finally {
    await server.stop();
  }
}

await main();
