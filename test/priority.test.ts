import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { BoxcarClient } from "@boxcar/client";
import { BoxcarError, ErrorCode, type JobRecord, type Priority } from "@boxcar/protocol";
import { eventually, type LocalSystem, localSystem, type Scratch, scratch } from "@boxcar/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

// One worker taking one job at a time, so the order jobs start in is the order it took them in.
let system: LocalSystem;
let client: BoxcarClient;
let dir: Scratch;
/** Every job of the agents below appends its id here when it runs. */
let ranFile: string;

beforeAll(async () => {
  system = await localSystem({ worker: { concurrency: 1 } });
  client = system.client;
  dir = await scratch("boxcar-priority-");
  ranFile = join(dir.path, "ran");
  await agent("p-job", `echo "$BOXCAR_JOB_ID" >> '${ranFile}'`);
  await agent("p-bulk", `echo "$BOXCAR_JOB_ID" >> '${ranFile}'`, { priority: "low" });
});
afterAll(async () => {
  await system?.[Symbol.asyncDispose]();
  await dir?.[Symbol.asyncDispose]();
});

async function agent(name: string, script: string, extra: Record<string, unknown> = {}) {
  await client.applyAgent({ name, command: ["sh", "-c", script], trusted: true, runtime: { sandbox: "host" }, ...extra });
}

async function ran(): Promise<string[]> {
  return (await readFile(ranFile, "utf8").catch(() => "")).split("\n").filter(Boolean);
}

/** How many items each priority's consumer of the default pool has delivered so far. */
async function deliveredByPriority(): Promise<Record<Priority, number>> {
  const { jsm, names } = system.nats.topology;
  const delivered = async (p: Priority) =>
    (await jsm.consumers.info(names.streams.work, names.poolConsumer("default", p))).delivered.consumer_seq;
  return { high: await delivered("high"), normal: await delivered("normal"), low: await delivered("low") };
}

describe("job priorities", () => {
  test("a busy worker takes the waiting high jobs first, then normal, then low; each priority in the order queued", async () => {
    const gate = join(dir.path, "gate-order");
    await agent("p-gate", `while [ ! -e '${gate}' ]; do sleep 0.05; done`);
    const { job: gateJob } = await client.submit({ agent: "p-gate" });
    await eventually(async () => ((await client.getJob(gateJob.id)).state === "running" ? true : undefined), "the gate job to run");
    const before = await deliveredByPriority();

    // Queued low, normal, high in turn: the worst order for a first-in, first-out queue.
    const queued: JobRecord[] = [];
    for (let i = 0; i < 4; i++) {
      queued.push((await client.submit({ agent: "p-bulk" })).job); // low: the agent's default
      queued.push((await client.submit({ agent: "p-job" })).job); // normal: the default of the defaults
      queued.push((await client.submit({ agent: i % 2 ? "p-bulk" : "p-job", priority: "high" })).job); // the job's own
    }
    expect(queued.map((j) => j.priority)).toEqual(Array.from({ length: 4 }, () => ["low", "normal", "high"]).flat());
    await writeFile(gate, "");
    for (const job of queued) expect((await client.waitForJob(job.id)).state).toBe("succeeded");

    const ids = (p: Priority) => queued.filter((j) => j.priority === p).map((j) => j.id);
    expect(await ran()).toEqual([...ids("high"), ...ids("normal"), ...ids("low")]);
    // Each priority went through its own consumer.
    const after = await deliveredByPriority();
    expect({ high: after.high - before.high, normal: after.normal - before.normal, low: after.low - before.low }).toEqual({
      high: 4,
      normal: 4,
      low: 4,
    });
  });

  test("an idle worker takes a job of each priority as it comes", async () => {
    for (const priority of ["low", "high", "normal"] as const) {
      const { job } = await client.submit({ agent: "p-job", priority });
      expect(await client.waitForJob(job.id)).toMatchObject({ state: "succeeded", priority });
    }
  });

  test("a retried job keeps its priority: the retry waits in the same queue, and an idle worker's waiting pull takes it when due", async () => {
    await agent("p-flaky", 'test "$BOXCAR_ATTEMPT" -ge 2', {
      priority: "low",
      retry: { maxAttempts: 2, delay: "100ms", jitter: false },
    });
    const before = await deliveredByPriority();
    const { job } = await client.submit({ agent: "p-flaky" });
    expect(await client.waitForJob(job.id)).toMatchObject({ state: "succeeded", attempt: 2, priority: "low" });
    const after = await deliveredByPriority();
    expect(after.low - before.low).toBe(2);
    expect(after.normal - before.normal).toBe(0);
  });

  test("a chain keeps the priority its job was submitted with; without one, each agent's own applies", async () => {
    await agent("p-next", "true", { priority: "low" });
    await agent("p-first", `printf '{"handoff":{"to":"p-next"}}' > "$BOXCAR_RESULT_FILE"`, { handoffs: ["p-next"] });
    const { job: urgent } = await client.submit({ agent: "p-first", priority: "high" });
    expect(await client.waitForChain(urgent.id)).toMatchObject({ agent: "p-next", state: "succeeded", priority: "high" });
    const { job: plain } = await client.submit({ agent: "p-first" });
    expect((await client.getJob(plain.id)).priority).toBe("normal");
    expect(await client.waitForChain(plain.id)).toMatchObject({ agent: "p-next", state: "succeeded", priority: "low" });
  });

  test("a workflow step's priority is its job's", async () => {
    const { run } = await client.startRun({
      workflow: { name: "p-flow", steps: [{ name: "only", agent: "p-job", priority: "high" }] },
    });
    const ended = await client.waitForRun(run.id);
    expect(ended.state).toBe("succeeded");
    const jobId = ended.steps.only?.instances[0]?.jobs[0] as string;
    expect((await client.getJob(jobId)).priority).toBe("high");
  });

  test("an unknown priority is refused with the field named, from the API, an agent and the CLI", async () => {
    const submitted = client.submit({ agent: "p-job", priority: "urgent" as Priority });
    await expect(submitted).rejects.toBeInstanceOf(BoxcarError);
    await expect(submitted).rejects.toMatchObject({ code: ErrorCode.invalid, issues: [expect.objectContaining({ path: "priority" })] });
    await expect(client.applyAgent({ name: "p-bad", command: ["true"], priority: "soon" as Priority })).rejects.toMatchObject({
      code: ErrorCode.invalid,
      issues: [expect.objectContaining({ path: "definition.priority" })],
    });
    const cli = await boxcar(system.nats.url, system.nats.topology.names.prefix, ["submit", "p-job", "--priority", "urgent"]);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toContain("--priority must be one of high, normal, low, got urgent");
  });
});
