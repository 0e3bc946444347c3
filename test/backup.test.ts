/**
 * `boxcar backup` and `boxcar restore` (docs/backup.md): a live backup of a running one-server
 * system, restored onto a fresh three-server cluster where a new dispatcher and worker carry on;
 * and the restores that must be refused, with nothing made.
 */

import { readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { gunzipSync, gzipSync } from "node:zlib";
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { type NatsServer, openTopology, startNatsServer, systemStreams, type WorkSigner } from "@boxcar/fabric";
import type { BoxcarEvent, JobRecord, WorkflowRun } from "@boxcar/protocol";
import { localSystem, natsCluster, type Scratch, scratch, uniquePrefix } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

const PRELUDE = `
const fs = require("node:fs");
const input = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8"));
const done = (r) => fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify(r));
`;
/** A trusted host agent whose command is a Node.js script. */
const agent = (name: string, script: string, extra: Record<string, unknown> = {}) => ({
  name,
  command: ["node", "-e", `${PRELUDE}\n${script}`],
  trusted: true,
  runtime: { sandbox: "host", timeout: "30s" },
  ...extra,
});
const MAKER = `fs.mkdirSync("out", { recursive: true });
  fs.writeFileSync("out/blob.bin", require("node:crypto").randomBytes(300000));
  fs.writeFileSync("out/note.txt", "job " + input.n + "\\n");
  console.log("made " + input.n);
  done({ output: { n: input.n }, summary: "made " + input.n });`;

let dir: Scratch;
let file: string;
const prefix = uniquePrefix();

/** What the source system held when it was backed up, to find again after the restore. */
const before: {
  finished: JobRecord[];
  artifacts: Map<string, Map<string, Buffer>>;
  events: string[];
  run?: WorkflowRun;
  parked?: JobRecord;
  delayed?: JobRecord;
  streams: string[];
  signer?: WorkSigner;
  dispatcherKeys: readonly string[];
} = { finished: [], artifacts: new Map(), events: [], streams: [], dispatcherKeys: [] };

/** With `BOXCAR_BACKUP_BENCH` set (even to 0), the commands' output and times are printed: docs/backup.md's figures. */
const note = (what: string, startedAt: number, output: string) => {
  if (process.env.BOXCAR_BACKUP_BENCH !== undefined)
    process.stderr.write(`\n${what}: ${Date.now() - startedAt} ms for the command\n${output}`);
};

const eventTypes = (events: BoxcarEvent[]) => events.map((e) => `${e.kind}:${e.type}`);

beforeAll(async () => {
  dir = await scratch("boxcar-backup-");
  file = join(dir.path, "system.backup");
});
afterAll(async () => {
  await dir?.[Symbol.asyncDispose]();
});

describe("backup and restore", () => {
  test("boxcar backup copies a running system: records, work, history and files, to a 0600 file", async () => {
    await using source = await localSystem({ topology: { prefix }, worker: { concurrency: 4 } });
    const { client } = source;
    await client.applyAgent(agent("maker", MAKER));
    await client.applyAgent(agent("broken", `console.error("no luck"); process.exit(3);`));
    await client.applyAgent(agent("parked", `done({ output: { late: input.n } });`, { pool: "later" }));

    const submitted = await Promise.all([
      ...[1, 2, 3].map((n) => client.submit({ agent: "maker", input: { n } })),
      client.submit({ agent: "broken", input: { n: 0 } }),
    ]);
    for (const { job } of submitted) before.finished.push(await client.waitForJob(job.id));
    expect(before.finished.map((j) => j.state)).toEqual(["succeeded", "succeeded", "succeeded", "failed"]);

    const { run } = await client.startRun({
      workflow: {
        name: "two-steps",
        steps: [
          { name: "first", agent: "maker", input: { n: 10 } },
          { name: "second", agent: "maker", needs: ["first"], input: { n: "{{ steps.first.output.n }}" } },
        ],
      },
    });
    before.run = await client.waitForRun(run.id);
    expect(before.run.state).toBe("succeeded");
    for (const step of Object.values(before.run.steps)) before.finished.push(await client.getJob(step.instances[0]?.jobs[0] as string));

    // Still queued at the backup: one for a pool no worker serves here, one an hour away.
    before.parked = (await client.submit({ agent: "parked", input: { n: 7 } })).job;
    before.delayed = (await client.submit({ agent: "maker", input: { n: 8 }, delay: "1h" })).job;
    await client.createSchedule({ name: "nightly", cron: "0 2 * * *", job: { agent: "maker", input: { n: 9 } } });

    for (const job of before.finished.filter((j) => j.agent === "maker")) {
      const out = join(dir.path, "before", job.id);
      await client.downloadArtifacts(job.id, out);
      before.artifacts.set(
        job.id,
        new Map(await Promise.all(job.artifacts.map(async (a) => [a.path, await readFile(join(out, a.path))] as const))),
      );
    }
    const first = before.finished[0] as JobRecord;
    for await (const e of client.events(first.id)) before.events.push(...eventTypes([e]));
    before.signer = source.nats.dispatcherRole.signer;
    before.dispatcherKeys = source.nats.auth.dispatcherKeys();
    const jsm = await jetstreamManager(source.nats.nc);
    const exists = (name: string) =>
      jsm.streams.info(name).then(
        () => true,
        () => false,
      );
    for (const { name } of systemStreams(prefix)) if (await exists(name)) before.streams.push(name);

    // Live: the dispatcher and the worker are still running.
    const backupStarted = Date.now();
    const backedUp = await boxcar(source.nats.url, prefix, ["backup", file]);
    note("backup", backupStarted, backedUp.stdout);
    expect(backedUp.code, backedUp.stderr).toBe(0);
    expect(backedUp.stdout).toMatch(new RegExp(`KV_${prefix}_jobs\\s+\\d+ messages`));
    expect(backedUp.stdout).toMatch(new RegExp(`OBJ_${prefix}_artifacts\\s+\\d+ messages`));
    expect(backedUp.stdout).toMatch(/backed up \d+ messages \(.+\) of \d+ streams/);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    await expect(stat(`${file}.partial`)).rejects.toThrow();
    expect(before.streams).toEqual(expect.arrayContaining([`KV_${prefix}_schedules`, `${prefix.toUpperCase()}_EVENTS`]));
  });

  test("boxcar restore makes it anew on a fresh three-server cluster, with 3 replicas, and a dispatcher and worker there carry on", async () => {
    await using cluster = await natsCluster(3);
    const restoreStarted = Date.now();
    const restored = await boxcar(cluster.url, prefix, ["restore", file]);
    note("restore onto a three-server cluster", restoreStarted, restored.stdout);
    expect(restored.code, restored.stderr).toBe(0);
    expect(restored.stdout).toMatch(/a complete backup of prefix/);
    expect(restored.stdout).toMatch(/restored \d+ messages of \d+ streams/);

    const nc = await cluster.connect();
    const jsm = await jetstreamManager(nc);
    const states = async () => {
      const out: Record<string, { messages: number; last: number; replicas: number }> = {};
      for await (const info of jsm.streams.list()) {
        out[info.config.name] = { messages: info.state.messages, last: info.state.last_seq, replicas: info.config.num_replicas };
      }
      return out;
    };
    const after = await states();
    expect(Object.keys(after).sort()).toEqual([...before.streams].sort());
    for (const [name, s] of Object.entries(after)) expect(s.replicas, name).toBe(3);

    // Again onto the same cluster: refused, naming the streams, and nothing changes.
    const again = await boxcar(cluster.url, prefix, ["restore", file]);
    expect(again.code).toBe(3);
    expect(again.stderr).toContain("conflict");
    expect(again.stderr).toContain(`${prefix.toUpperCase()}_WORK`);
    expect(await states()).toEqual(after);

    // The roles, on the system's credentials: the dispatcher's key signs, the worker trusts it.
    const topology = await openTopology(nc, { prefix });
    expect(topology.options.replicas).toBe(3);
    await using _dispatcher = await startDispatcher({ topology, signer: before.signer as WorkSigner });
    const worker = createWorker({
      topology: await openTopology(await cluster.connect(), { prefix }),
      dispatcherKeys: before.dispatcherKeys,
      providers: [createHostSandboxProvider()],
      pools: ["default", "later"],
    });
    void worker.run();
    try {
      const client = createClient(topology);
      for (const job of before.finished) expect(await client.getJob(job.id), job.id).toEqual(job);
      for (const [id, files] of before.artifacts) {
        const out = join(dir.path, "after", id);
        await client.downloadArtifacts(id, out);
        for (const [path, bytes] of files) expect((await readFile(join(out, path))).equals(bytes), `${id} ${path}`).toBe(true);
      }
      const events: string[] = [];
      for await (const e of client.events((before.finished[0] as JobRecord).id)) events.push(...eventTypes([e]));
      expect(events).toEqual(before.events);
      expect(await client.getRun(before.run?.id as string)).toEqual(before.run);
      expect((await client.listAgents()).map((a) => a.name).sort()).toEqual(["broken", "maker", "parked"]);
      expect((await client.listSchedules()).map((s) => s.definition.name)).toEqual(["nightly"]);
      const delayed = await client.getJob(before.delayed?.id as string);
      expect([delayed.state, delayed.runAt]).toEqual(["queued", before.delayed?.runAt]);

      // The job that was queued at the backup runs here.
      const parked = await client.waitForJob(before.parked?.id as string);
      expect([parked.state, parked.attempt, parked.result?.output]).toEqual(["succeeded", 1, { late: 7 }]);
    } finally {
      await worker.close();
    }
  }, 240_000); // natsCluster may start the cluster again

  describe("refused, with nothing made", () => {
    let server: NatsServer;
    beforeAll(async () => {
      server = await startNatsServer({});
    });
    afterAll(async () => {
      await server?.stop();
    });

    const streamsThere = async () => {
      const nc = await connect({ servers: server.url });
      try {
        const names: string[] = [];
        for await (const name of (await jetstreamManager(nc)).streams.names()) names.push(name);
        return names.sort();
      } finally {
        await nc.close();
      }
    };
    /** The backup's lines, changed by `edit`, written gzip'd to a new file. */
    const edited = async (name: string, edit: (lines: string[]) => string[]) => {
      const lines = gunzipSync(await readFile(file))
        .toString("utf8")
        .trimEnd()
        .split("\n");
      const path = join(dir.path, name);
      await writeFile(path, gzipSync(`${edit(lines).join("\n")}\n`));
      return path;
    };
    const refused = async (path: string, message: RegExp, args: string[] = []) => {
      const run = await boxcar(server.url, prefix, ["restore", path, ...args]);
      expect(run.stderr).toMatch(message);
      expect(run.code, run.stderr).toBe(2);
      expect(await streamsThere()).toEqual([]);
    };

    test("a file that is not a backup, a truncated or corrupt one, another version or another prefix's", async () => {
      const text = join(dir.path, "notes.txt");
      await writeFile(text, "hello\n");
      await refused(text, /is not a Boxcar backup: it is not gzip data/);
      await refused(await edited("other.gz", () => ['{"hello":"world"}']), /is not a Boxcar backup/);

      const whole = await readFile(file);
      const truncated = join(dir.path, "truncated.backup");
      await writeFile(truncated, whole.subarray(0, Math.floor(whole.length * 0.6)));
      await refused(truncated, /is truncated/);
      await refused(await edited("no-end.backup", (lines) => lines.slice(0, -1)), /is truncated: it ends before the line that closes/);
      const corrupt = join(dir.path, "corrupt.backup");
      const flipped = Buffer.from(whole);
      const middle = Math.floor(flipped.length / 2);
      for (let i = middle; i < middle + 64; i++) flipped[i] = (flipped[i] ?? 0) ^ 0x5a;
      await writeFile(corrupt, flipped);
      await refused(corrupt, /is (corrupt|truncated)/);

      const v2 = (lines: string[]) => [JSON.stringify({ ...JSON.parse(lines[0] as string), version: 2 }), ...lines.slice(1)];
      await refused(await edited("v2.backup", v2), /format version 2; this boxcar reads version 1 only/);
      await refused(file, new RegExp(`backup of the system with prefix ${prefix}, not other: restore it with --prefix ${prefix}`), [
        "--prefix",
        "other",
      ]);
    });

    test("a stream or a subject that is not the prefix's own", async () => {
      const renamed = (lines: string[]) =>
        lines.map((l) =>
          l.includes(`"name":"${prefix.toUpperCase()}_DEAD"`) ? l.replaceAll(`${prefix.toUpperCase()}_DEAD`, "ELSEWHERE") : l,
        );
      await refused(await edited("foreign-stream.backup", renamed), /holds a stream ELSEWHERE, which is not one of a Boxcar system/);
      let moved = false;
      const subject = (lines: string[]) =>
        lines.map((l) => {
          if (moved || !l.startsWith('{"seq"') || !l.includes(`"subject":"$KV.${prefix}_jobs.`)) return l;
          moved = true;
          return l.replace(/"subject":"[^"]+"/, '"subject":"$JS.API.STREAM.DELETE.X"');
        });
      await refused(await edited("foreign-subject.backup", subject), /holds a message on \$JS\.API\.STREAM\.DELETE\.X .* refused/);
    });

    test("a restore that fails part way says which streams it made; once they are deleted, it runs again", async () => {
      // Valid to read, but JetStream refuses the job records' messages: their stream allows 16 bytes.
      const small = (lines: string[]) =>
        lines.map((l) => {
          if (!l.startsWith('{"type":"stream"') || !l.includes(`"name":"KV_${prefix}_jobs"`)) return l;
          const line = JSON.parse(l);
          return JSON.stringify({ ...line, config: { ...line.config, max_msg_size: 16 } });
        });
      const run = await boxcar(server.url, prefix, ["restore", await edited("small.backup", small)]);
      expect(run.code).not.toBe(0);
      // Every stream is made before any message is published.
      expect(run.stderr).toContain(`restore failed at stream KV_${prefix}_jobs`);
      expect(run.stderr).toContain(
        `It made ${before.streams.length} of ${before.streams.length} streams: ${before.streams.join(", ")}; delete them`,
      );
      const made = await streamsThere();
      expect(made).toEqual([...before.streams].sort());
      const nc = await connect({ servers: server.url });
      const jsm = await jetstreamManager(nc);
      for (const name of made) await jsm.streams.delete(name);
      await nc.close();
      const againStarted = Date.now();
      const again = await boxcar(server.url, prefix, ["restore", file]);
      note("restore onto one server", againStarted, again.stdout);
      expect(again.code, again.stderr).toBe(0);
      expect(again.stdout).toMatch(/ 1 replica\n/);
      expect(await streamsThere()).toEqual([...before.streams].sort());
    });
  });
});

/**
 * The figures in docs/backup.md: `BOXCAR_BACKUP_BENCH=5000 npx vitest run test/backup.test.ts -t figures`
 * runs that many small jobs (a 4 KiB artifact each), backs the system up, and restores it onto a
 * fresh single server and a fresh three-server cluster, printing sizes and times. Skipped unless
 * asked for; it checks that each step succeeds, never how long it took.
 */
const BENCH_JOBS = Number(process.env.BOXCAR_BACKUP_BENCH ?? 0);
/** What `boxcar restore --json` says it did, in a line. */
const restoreFigures = (stdout: string) => {
  const summary = JSON.parse(stdout) as { ms: number; checkMs: number; replicas: number; streams: { filled: number }[] };
  const filled = summary.streams.reduce((n, s) => n + s.filled, 0);
  return `${summary.ms} ms restoring (${summary.checkMs} ms of it checking the file), ${summary.replicas} replicas, ${filled} gaps filled`;
};
test.skipIf(!BENCH_JOBS)(
  "figures: backup and restore of many jobs",
  async () => {
    const benchPrefix = uniquePrefix();
    const path = join(dir.path, "bench.backup");
    const timed = async <T>(work: () => Promise<T>): Promise<[T, number]> => {
      const started = performance.now();
      const value = await work();
      return [value, Math.round(performance.now() - started)];
    };
    const report: string[] = [`${BENCH_JOBS} jobs`];
    {
      await using source = await localSystem({ topology: { prefix: benchPrefix }, worker: { concurrency: 16 } });
      const { client } = source;
      await client.applyAgent(
        agent(
          "tiny",
          `fs.mkdirSync("out", { recursive: true }); fs.writeFileSync("out/a.bin", require("node:crypto").randomBytes(4096)); done({ output: input });`,
        ),
      );
      const [, runMs] = await timed(async () => {
        for (let i = 0; i < BENCH_JOBS; i += 200) {
          const batch = await Promise.all(
            Array.from({ length: Math.min(200, BENCH_JOBS - i) }, (_, j) => client.submit({ agent: "tiny", input: { n: i + j } })),
          );
          for (const { job } of batch) {
            const ended = await client.waitForJob(job.id);
            expect(ended.state, JSON.stringify(ended.error)).toBe("succeeded");
          }
        }
      });
      report.push(`ran in ${runMs} ms`);
      const [backedUp, backupMs] = await timed(() => boxcar(source.nats.url, benchPrefix, ["backup", path, "--json"]));
      expect(backedUp.code, backedUp.stderr).toBe(0);
      const summary = JSON.parse(backedUp.stdout) as { messages: number; bytes: number; fileBytes: number; ms: number };
      report.push(
        `backup: ${summary.messages} messages, ${summary.bytes} bytes, file ${summary.fileBytes} bytes; ${summary.ms} ms copying, ${backupMs} ms for the command`,
      );
      const jsm = await jetstreamManager(source.nats.nc);
      for await (const info of jsm.streams.list()) {
        if (info.state.messages > 0)
          report.push(`  ${info.config.name}: ${info.state.messages} messages, ${info.state.bytes} bytes on disk`);
      }
    }
    {
      const server = await startNatsServer({});
      try {
        const [restored, ms] = await timed(() => boxcar(server.url, benchPrefix, ["restore", path, "--json"]));
        expect(restored.code, restored.stderr).toBe(0);
        report.push(`restore onto one server: ${restoreFigures(restored.stdout)}, ${ms} ms for the command`);
      } finally {
        await server.stop();
      }
    }
    {
      await using cluster = await natsCluster(3);
      const [restored, ms] = await timed(() => boxcar(cluster.url, benchPrefix, ["restore", path, "--json"]));
      expect(restored.code, restored.stderr).toBe(0);
      report.push(`restore onto a three-server cluster: ${restoreFigures(restored.stdout)}, ${ms} ms for the command`);
    }
    process.stderr.write(`\n${report.join("\n")}\n`);
  },
  1_800_000,
);
