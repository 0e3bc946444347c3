import { type BoxcarClient, createClient } from "@boxcar/client";
import { listJson } from "@boxcar/fabric/internal";
import { JobRecord, type WorkflowRun } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker, type Worker } from "@boxcar/worker";
import { afterEach, beforeEach, expect, test } from "vitest";
import { exited, spawnBoxcar } from "./helpers/cli.js";

let nats: NatsFixture;
let worker: Worker;
let client: BoxcarClient;
let dispatcher: ReturnType<typeof spawnBoxcar> | undefined;

beforeEach(async () => {
  nats = await natsFixture();
  worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()], concurrency: 6 });
  void worker.run();
  client = createClient(nats.topology);
  await startDispatcher();
  await client.applyAgent({
    name: "nap",
    command: ["node", "-e", NAP],
    trusted: true,
    runtime: { sandbox: "host", timeout: "30s" },
  });
});
afterEach(async () => {
  await killDispatcher();
  await worker?.close();
  await nats?.[Symbol.asyncDispose]();
});

/** Sleeps `input.ms` (default 400), then reports its input. */
const NAP = `
const fs = require("node:fs");
const input = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8"));
setTimeout(() => fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: input })), (input && input.ms) || 400);
`;

async function startDispatcher(): Promise<void> {
  dispatcher = spawnBoxcar(nats.url, nats.topology.names.prefix, ["dispatcher"]);
  await eventually(async () => (/dispatcher started/.test(dispatcher?.output() ?? "") ? true : undefined), "the dispatcher to start");
}

async function killDispatcher(): Promise<void> {
  if (!dispatcher) return;
  dispatcher.kill("SIGKILL");
  await exited(dispatcher);
  dispatcher = undefined;
}

async function runRecord(id: string): Promise<WorkflowRun> {
  return client.getRun(id).catch(async () => {
    // No dispatcher to ask: read the bucket, as the dispatcher would.
    const entry = await nats.topology.workflows.get(id);
    return entry?.json() as WorkflowRun;
  });
}

/** The jobs of a run, by step and item: each must have been started exactly once. */
async function jobsByInstance(runId: string): Promise<Map<string, JobRecord[]>> {
  const byInstance = new Map<string, JobRecord[]>();
  for (const job of await listJson(nats.topology.jobs, JobRecord, "job record")) {
    if (job.chain?.run !== runId) continue;
    const key = `${job.chain.step}[${job.chain.index ?? 0}]`;
    byInstance.set(key, [...(byInstance.get(key) ?? []), job]);
  }
  return byInstance;
}

test("a dispatcher killed mid-workflow and restarted completes it, each step run once", async () => {
  const { run } = await client.startRun({
    workflow: {
      name: "relay",
      steps: [
        { name: "a", agent: "nap" },
        { name: "b", agent: "nap", needs: ["a"] },
        { name: "c", agent: "nap", needs: ["b"] },
        { name: "d", agent: "nap", needs: ["c"] },
      ],
    },
  });
  const bJob = await eventually(async () => (await runRecord(run.id)).steps.b?.instances[0]?.jobs[0], "step b's job to start");
  await killDispatcher();

  // With no dispatcher, b finishes but nothing moves the run on.
  await eventually(
    async () => ((await nats.topology.jobs.get(bJob))?.json<JobRecord>().state === "succeeded" ? true : undefined),
    "b's job",
  );
  await new Promise((r) => setTimeout(r, 500));
  expect((await runRecord(run.id)).steps.c?.state).toBe("pending");

  await startDispatcher();
  const finished = await client.waitForRun(run.id);
  expect(finished.state).toBe("succeeded");
  const jobs = await jobsByInstance(run.id);
  expect([...jobs.keys()].sort()).toEqual(["a[0]", "b[0]", "c[0]", "d[0]"]);
  for (const list of jobs.values()) expect(list.map((j) => [j.state, j.attempt])).toEqual([["succeeded", 1]]);
});

test("a dispatcher killed over and over during a fan-out and join: every item runs once and the join sees all", async () => {
  const items = Array.from({ length: 24 }, (_, i) => ({ i, ms: 400 + ((i * 137) % 800) }));
  const { run } = await client.startRun({
    workflow: {
      name: "storm",
      steps: [
        { name: "split", agent: "nap", input: { items: "{{ input.items }}", ms: 50 } },
        { name: "work", agent: "nap", needs: ["split"], forEach: "{{ steps.split.output.items }}", input: "{{ item }}" },
        { name: "join", agent: "nap", needs: ["work"], input: { results: "{{ steps.work.output }}", ms: 50 } },
      ],
    },
    input: { items },
  });
  let kills = 0;
  for (;;) {
    await new Promise((r) => setTimeout(r, 200 + ((kills * 211) % 400)));
    const current = await runRecord(run.id);
    if (current.state !== "running") break;
    await killDispatcher();
    kills += 1;
    await startDispatcher();
  }
  const finished = await client.waitForRun(run.id);
  process.stdout.write(`fan-out of ${items.length} with a join: ${kills} dispatcher kills, run ${finished.state}\n`);
  expect(kills).toBeGreaterThan(0);
  expect(finished.state).toBe("succeeded");
  expect(finished.output).toEqual({ results: items, ms: 50 });
  const jobs = await jobsByInstance(run.id);
  expect(jobs.size).toBe(items.length + 2);
  const repeated = [...jobs].filter(([, list]) => list.length !== 1).map(([k, list]) => `${k}: ${list.length} jobs`);
  expect(repeated).toEqual([]);
});

test("three dispatchers advancing the same runs at once start each step once", async () => {
  const others = [
    spawnBoxcar(nats.url, nats.topology.names.prefix, ["dispatcher"]),
    spawnBoxcar(nats.url, nats.topology.names.prefix, ["dispatcher"]),
  ];
  try {
    for (const d of others)
      await eventually(async () => (/dispatcher started/.test(d.output()) ? true : undefined), "a dispatcher to start");
    const items = Array.from({ length: 12 }, (_, i) => ({ i, ms: 100 + ((i * 53) % 200) }));
    const started = await Promise.all(
      [1, 2, 3].map(() =>
        client.startRun({
          workflow: {
            name: "crowd",
            steps: [
              { name: "split", agent: "nap", input: { items: "{{ input.items }}", ms: 20 } },
              { name: "work", agent: "nap", needs: ["split"], forEach: "{{ steps.split.output.items }}", input: "{{ item }}" },
              { name: "check", agent: "nap", needs: ["split"], input: { ms: 20 } },
              { name: "join", agent: "nap", needs: ["work", "check"], input: { results: "{{ steps.work.output }}", ms: 20 } },
            ],
          },
          input: { items },
        }),
      ),
    );
    for (const { run } of started) {
      const finished = await client.waitForRun(run.id);
      expect(finished.state).toBe("succeeded");
      const jobs = await jobsByInstance(run.id);
      expect(jobs.size).toBe(items.length + 3);
      expect([...jobs].filter(([, list]) => list.length !== 1).map(([k]) => k)).toEqual([]);
    }
  } finally {
    for (const d of others) d.kill("SIGTERM");
    await Promise.all(others.map(exited));
  }
});
