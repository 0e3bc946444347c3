/**
 * What authentication costs: the no-op job path (memory workspace: no process, no files) on a
 * nats-server without authentication (`open`), on one run from `boxcar auth init`'s config with
 * work items unsigned (`unsigned`: credentials and the server's permission checks only), and
 * with everything (`auth`: also every work item signed by the dispatcher and checked by the
 * worker). The client is a submitter. The variants run interleaved, in rounds whose order
 * rotates, each on a fresh server, so the machine's drift hits all alike. In all three the jobs
 * bucket is watched on a connection of its own (a submitter may not), and every connection is
 * made as `connectNats` makes it (no async stack traces).
 *
 * Run it with `pnpm bench:auth`. Environment: BENCH_ROUNDS (default 3), BENCH_N (jobs one at a
 * time per run, default 500), BENCH_M (jobs at BENCH_IN_FLIGHT in flight, default 3000 and 64).
 */
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AuthDir } from "@boxcar/auth";
import { startNatsServer } from "@boxcar/fabric";
import { openBoxcarPath } from "./boxcar-path.js";
import { createInstantSandboxProvider } from "./instant-sandbox.js";
import { saturate, sequential } from "./load.js";
import { messageCounts } from "./round-trips.js";
import { envInt, ms, summarize, table } from "./stats.js";

const settings = {
  rounds: envInt("BENCH_ROUNDS", 3),
  sequentialJobs: envInt("BENCH_N", 500),
  saturationJobs: envInt("BENCH_M", 3000),
  inFlight: envInt("BENCH_IN_FLIGHT", 64),
};
const log = (line: string) => process.stderr.write(`${line}\n`);

/** open: no authentication; unsigned: credentials and permissions, work items unsigned; auth: both. */
const VARIANTS = ["open", "unsigned", "auth"] as const;
type Variant = (typeof VARIANTS)[number];

interface Round {
  variant: Variant;
  p50: number;
  p99: number;
  jobsPerSecond: number;
  /** Messages and bytes each role's connection sent and received per job, in the saturated run. */
  perJob: { messages: number; bytes: number };
}

async function round(variant: Variant, index: number): Promise<Round> {
  const root = await mkdtemp(join(tmpdir(), "boxcar-bench-auth-"));
  const prefix = `benchauth${index}`;
  const auth = variant !== "open" ? await AuthDir.init(join(root, "auth"), { prefix }) : undefined;
  const server = await startNatsServer(auth ? { extraConfig: await readFile(join(auth.dir, "auth.conf"), "utf8") } : {});
  try {
    await using path = await openBoxcarPath({
      url: server.url,
      prefix,
      providers: [createInstantSandboxProvider("memory", root)],
      concurrency: 64,
      ...(auth ? { auth, signWork: variant === "auth" } : {}),
      separateObserver: true, // as with auth, whose submitter may not watch the bucket itself
      // What `connectNats` (the auth side's connections) sets too: no async stack traces, a user's inboxes.
      connectOptions: { noAsyncTraces: true, inboxPrefix: "_INBOX.local" },
    });
    const conns = [...Object.values(path.connections), path.observer];
    let next = 0;
    const take = (n: number) => {
      next += n;
      return next - n;
    };
    await sequential(path.run, 200, take(200)); // warm-up
    await saturate(path.run, 1_000, settings.inFlight, take(1_000));
    const seq = summarize(await sequential(path.run, settings.sequentialJobs, take(settings.sequentialJobs)));
    const before = conns.map(messageCounts);
    const stats = conns.map((nc) => nc.stats());
    const sat = await saturate(path.run, settings.saturationJobs, settings.inFlight, take(settings.saturationJobs));
    const after = conns.map(messageCounts);
    const statsAfter = conns.map((nc) => nc.stats());
    if (path.unsuccessful > 0) throw new Error(`${variant}: ${path.unsuccessful} jobs did not succeed; the figures are not valid`);
    const messages = after.reduce((sum, a, i) => sum + a.out + a.in - (before[i]?.out ?? 0) - (before[i]?.in ?? 0), 0);
    const bytes = statsAfter.reduce((sum, a, i) => sum + a.inBytes + a.outBytes - (stats[i]?.inBytes ?? 0) - (stats[i]?.outBytes ?? 0), 0);
    return {
      variant,
      p50: seq.p50,
      p99: seq.p99,
      jobsPerSecond: sat.jobsPerSecond,
      perJob: { messages: messages / settings.saturationJobs, bytes: bytes / settings.saturationJobs },
    };
  } finally {
    await server.stop();
    await rm(root, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const rounds: Round[] = [];
  for (let i = 0; i < settings.rounds; i++) {
    // Rotate which goes first, so a place in the round (a warmer machine, say) favours none.
    for (const variant of [...VARIANTS.slice(i % 3), ...VARIANTS.slice(0, i % 3)]) {
      log(`round ${i + 1}/${settings.rounds}: ${variant}`);
      rounds.push(await round(variant, rounds.length));
    }
  }
  const rows = rounds.map((r) => [
    r.variant,
    ms(r.p50),
    ms(r.p99),
    r.jobsPerSecond.toFixed(0),
    r.perJob.messages.toFixed(1),
    r.perJob.bytes.toFixed(0),
  ]);
  console.log(
    table([["variant", "p50 (one at a time)", "p99", `jobs/s (${settings.inFlight} in flight)`, "messages/job", "bytes/job"], ...rows]),
  );
  for (const variant of VARIANTS) {
    const of = rounds.filter((r) => r.variant === variant);
    const p50s = of.map((r) => r.p50).sort((a, b) => a - b);
    const rates = of.map((r) => r.jobsPerSecond).sort((a, b) => a - b);
    console.log(
      `${variant}: p50 ${ms(p50s[0] ?? Number.NaN)}-${ms(p50s.at(-1) ?? Number.NaN)}, ${(rates[0] ?? 0).toFixed(0)}-${(rates.at(-1) ?? 0).toFixed(0)} jobs/s`,
    );
  }
}

await main();
