/**
 * How long `boxcar` takes to answer, as a user runs it (a new process each time): `pnpm bench:cli`.
 * docs/benchmarks.md#cli-start has the figures.
 *
 * One nats-server and one dispatcher (in this process) with BENCH_JOBS job records (default
 * 1000) written straight into the jobs bucket. Each round runs, one after the other, `node -e 0`
 * (the floor: Node's own start), `boxcar --version`, `boxcar --help` and `boxcar jobs --limit 20`
 * against that system, as `bin/boxcar` runs them (the bundle) and as `tsc` wrote them (not
 * bundled), so the machine's noise falls on all alike; BENCH_ROUNDS rounds (default
 * 30) after 2 that are not counted. Wall time from spawn to exit, p50 and p90.
 *
 * BENCH_CLI_COMPARE=LABEL=PATH[,LABEL=PATH...] adds the same three commands of other builds (an
 * older checkout, `git worktree add /tmp/cli-before COMMIT`, PATH its
 * packages/cli/dist/bin/boxcar.js, or its dist/bundle/boxcar.js once built) to each round, to compare in one run. Their `--version` may be
 * an unknown command (exit 2, before it existed): its time is counted all the same.
 */
import { execFile } from "node:child_process";
import { cpus } from "node:os";
import { fileURLToPath } from "node:url";
import { startDispatcher } from "@boxcar/dispatcher";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { type JobRecord, PROTOCOL_VERSION } from "@boxcar/protocol";
import { connect } from "@nats-io/transport-node";
import { envInt, gitCommit, ms, summarize, table } from "./stats.js";

const BOXCAR_BIN = fileURLToPath(new URL("../../packages/cli/dist/bundle/boxcar.js", import.meta.url));
/** The same CLI as `tsc` wrote it, not bundled: what the bundle buys, in the same run. */
const UNBUNDLED_BIN = fileURLToPath(new URL("../../packages/cli/dist/bin/boxcar.js", import.meta.url));
const settings = { jobs: envInt("BENCH_JOBS", 1000), rounds: envInt("BENCH_ROUNDS", 30) };
const WARM_UP_ROUNDS = 2;
const log = (line: string) => process.stderr.write(`${line}\n`);

interface Variant {
  name: string;
  args: string[];
  /** Exit codes that count as a run (another build's `--version` may be a usage error). */
  codes: readonly number[];
  /** Throws when the output is not what the command should print: a fast failure must not pass for a fast start. */
  check(stdout: string): void;
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
  ms: number;
}

/** Other builds to measure beside this one: `label=path` pairs. */
function comparedBuilds(value: string | undefined): { label: string; bin: string }[] {
  if (!value) return [];
  return value.split(",").map((pair) => {
    const at = pair.indexOf("=");
    if (at < 1) throw new Error(`BENCH_CLI_COMPARE takes LABEL=PATH pairs, got ${JSON.stringify(pair)}`);
    return { label: pair.slice(0, at), bin: pair.slice(at + 1) };
  });
}

/** Runs `node ARGS` to its end; its wall time from spawn to exit. Not execFileSync: the dispatcher answering it runs in this process. */
function timed(args: string[], env: NodeJS.ProcessEnv): Promise<Run> {
  return new Promise((resolve) => {
    const started = performance.now();
    execFile(process.execPath, args, { env, maxBuffer: 16 * 1024 * 1024, timeout: 60_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === "number" ? err.code : 1) : 0;
      resolve({ code, stdout, stderr, ms: performance.now() - started });
    });
  });
}

function variantsOf(label: string, bin: string, other: boolean): Variant[] {
  const lines = (n: number) => (stdout: string) => {
    const count = stdout.trimEnd().split("\n").length;
    if (count !== n) throw new Error(`${label} jobs printed ${count} lines, not ${n}:\n${stdout}`);
  };
  return [
    {
      name: `${label}boxcar --version`,
      args: [bin, "--version"],
      codes: other ? [0, 2] : [0],
      check: (stdout) => {
        if (!other && !/^boxcar \d+\.\d+\.\d+\n$/.test(stdout)) throw new Error(`--version printed ${JSON.stringify(stdout)}`);
      },
    },
    {
      name: `${label}boxcar --help`,
      args: [bin, "--help"],
      codes: [0],
      check: (stdout) => {
        if (!stdout.includes("usage: boxcar COMMAND")) throw new Error(`--help printed ${JSON.stringify(stdout.slice(0, 200))}`);
      },
    },
    // A header and 20 jobs, and the line that says how to ask for more.
    { name: `${label}boxcar jobs --limit 20`, args: [bin, "jobs", "--limit", "20"], codes: [0], check: lines(22) },
  ];
}

function jobRecord(i: number, start: number): JobRecord {
  const at = new Date(start + i * 10).toISOString();
  const id = `${(start + i * 10).toString(36).padStart(9, "0")}${i.toString(36).padStart(10, "0")}`;
  return {
    v: PROTOCOL_VERSION,
    id,
    agent: `agent${i % 10}`,
    pool: "default",
    owner: "local",
    state: "succeeded",
    spec: { v: PROTOCOL_VERSION, agent: `agent${i % 10}`, input: { i }, files: [], labels: {} },
    attempt: 1,
    createdAt: at,
    finishedAt: at,
    artifacts: [],
    history: [],
  } as JobRecord;
}

async function main(): Promise<void> {
  const server = await startNatsServer();
  const nc = await connect({ servers: server.url, noAsyncTraces: true });
  const topology = await openTopology(nc, {});
  try {
    const start = Date.now() - settings.jobs * 10;
    for (let i = 0; i < settings.jobs; i += 256) {
      const batch = Array.from({ length: Math.min(256, settings.jobs - i) }, (_, k) =>
        topology.jobStore.create({ record: jobRecord(i + k, start) }),
      );
      await Promise.all(batch);
    }
    await using _dispatcher = await startDispatcher({ topology });
    const env = { ...process.env, BOXCAR_NATS_URL: server.url, BOXCAR_AUTH_DIR: "/nonexistent" };
    const variants: Variant[] = [
      { name: "node -e 0", args: ["-e", "0"], codes: [0], check: () => {} },
      ...variantsOf("", BOXCAR_BIN, false),
      ...variantsOf("not bundled: ", UNBUNDLED_BIN, false),
      ...comparedBuilds(process.env.BENCH_CLI_COMPARE).flatMap(({ label, bin }) => variantsOf(`${label}: `, bin, true)),
    ];
    const samples = new Map<string, number[]>(variants.map((v) => [v.name, []]));
    log(`${variants.length} commands, ${settings.rounds} rounds after ${WARM_UP_ROUNDS} to warm up; ${settings.jobs} jobs stored`);
    for (let round = 0; round < WARM_UP_ROUNDS + settings.rounds; round++) {
      for (const variant of variants) {
        const run = await timed(variant.args, env);
        if (!variant.codes.includes(run.code)) throw new Error(`${variant.name} exited ${run.code}:\n${run.stderr}`);
        variant.check(run.stdout);
        if (round >= WARM_UP_ROUNDS) samples.get(variant.name)?.push(run.ms);
      }
    }
    const floor = summarize(samples.get("node -e 0") ?? []).p50;
    const rows = [["command", "p50 ms", "p90 ms", "p50 / node -e 0"]];
    for (const variant of variants) {
      const s = summarize(samples.get(variant.name) ?? []);
      rows.push([variant.name, ms(s.p50), ms(s.p90), `${(s.p50 / floor).toFixed(2)}×`]);
    }
    const version = summarize(samples.get("boxcar --version") ?? []).p50;
    const jobs = summarize(samples.get("boxcar jobs --limit 20") ?? []).p50;
    process.stdout.write(
      `boxcar start, commit ${gitCommit()}, node ${process.version}, ${cpus().length} CPUs; ${settings.rounds} rounds, interleaved\n${table(rows)}\n\n` +
        `target: boxcar --version within 2× node -e 0: ${(version / floor).toFixed(2)}× (${version <= 2 * floor ? "met" : "not met"})\n` +
        `target: boxcar jobs --limit 20 within 250 ms: ${ms(jobs)} ms (${jobs <= 250 ? "met" : "not met"})\n`,
    );
  } finally {
    await nc.close();
    await server.stop();
  }
}

await main();
