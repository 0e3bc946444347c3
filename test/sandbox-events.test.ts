import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { SandboxBackend } from "@boxcar/protocol";
import { boxcarContainers, dockerReady, eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { createWorker, type Worker } from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";

const docker = await dockerReady();

/** The sandbox steps every run goes through, whatever its outcome. */
const SANDBOX_STEPS = ["sandbox.creating", "sandbox.ready", "sandbox.exec_started", "sandbox.exec_exited", "sandbox.destroyed"];

describe.each<[SandboxBackend, boolean]>([
  ["host", true],
  ["docker", docker],
])("the full event sequence of a %s sandbox", (backend, available) => {
  let nats: NatsFixture;
  let dispatcher: Dispatcher;
  let worker: Worker;
  let client: BoxcarClient;

  beforeAll(async () => {
    if (!available) return;
    nats = await natsFixture();
    dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    worker = createWorker({ ...nats.workerRole });
    void worker.run();
    client = createClient(nats.topology);
  });
  afterAll(async () => {
    await worker?.close();
    await dispatcher?.close();
    await nats?.[Symbol.asyncDispose]();
  });

  async function sequence(name: string, script: string, timeout = "30s", whileRunning?: (jobId: string) => Promise<void>) {
    await client.applyAgent({ name, command: ["sh", "-c", script], trusted: true, runtime: { sandbox: backend, timeout } });
    const { job } = await client.submit({ agent: name });
    await whileRunning?.(job.id);
    const final = await client.waitForJob(job.id);
    const types: string[] = [];
    for await (const e of client.events(job.id)) if (e.type !== "progress") types.push(`${e.kind}.${e.type}`);
    return { final, types };
  }

  test.skipIf(!available)("succeeded", async () => {
    const { final, types } = await sequence(`ok-${backend}`, "echo fine");
    expect(final.state).toBe("succeeded");
    expect(types).toEqual(["job.accepted", "job.queued", "job.started", ...SANDBOX_STEPS, "job.succeeded"]);
  });

  test.skipIf(!available)("failed", async () => {
    const { final, types } = await sequence(`bad-${backend}`, "exit 3");
    expect(final.state).toBe("failed");
    expect(final.result?.exitCode).toBe(3);
    expect(types).toEqual(["job.accepted", "job.queued", "job.started", ...SANDBOX_STEPS, "job.failed"]);
  });

  test.skipIf(!available)("timed out", async () => {
    const { final, types } = await sequence(`slow-${backend}`, "sleep 300", "1s");
    expect(final.state).toBe("timed_out");
    expect(types).toEqual(["job.accepted", "job.queued", "job.started", ...SANDBOX_STEPS, "job.timed_out"]);
  });

  test.skipIf(!available)("cancelled", async () => {
    const { final, types } = await sequence(`stop-${backend}`, "echo started; sleep 300", "1m", async (jobId) => {
      await eventually(async () => {
        const seen: string[] = [];
        for await (const e of client.events(jobId)) seen.push(e.type);
        return seen.includes("exec_started") ? true : undefined;
      }, "the agent to start");
      await client.cancelJob(jobId);
    });
    expect(final.state).toBe("cancelled");
    const [creating, ready, execStarted, ...ending] = SANDBOX_STEPS;
    expect(types).toEqual([
      "job.accepted",
      "job.queued",
      "job.started",
      creating,
      ready,
      execStarted,
      "job.cancel_requested",
      ...ending,
      "job.cancelled",
    ]);
    if (backend === "docker") expect(await boxcarContainers(nats.topology.names.prefix, final.id)).toEqual([]);
  });
});

describe("how an attempt's events are stored", () => {
  let nats: NatsFixture;
  let dispatcher: Dispatcher;
  let worker: Worker;
  let client: BoxcarClient;

  beforeAll(async () => {
    nats = await natsFixture();
    dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    // Held for 1.5 s rather than 250 ms: on a loaded machine (CI) a no-op attempt has taken
    // longer than 250 ms, and its events went out one by one.
    worker = createWorker({ ...nats.workerRole, eventHoldMs: 1_500 });
    void worker.run();
    client = createClient(nats.topology);
  });
  afterAll(async () => {
    await worker?.close();
    await dispatcher?.close();
    await nats?.[Symbol.asyncDispose]();
  });

  /** The job's stored event messages, by subject ending (`job.succeeded`, `sandbox.ready`, ...). */
  async function storedSubjects(jobId: string): Promise<Record<string, number>> {
    const { names } = nats.topology;
    const info = await nats.topology.jsm.streams.info(names.streams.events, { subjects_filter: `${names.prefix}.evt.*.*.${jobId}.*` });
    return Object.fromEntries(
      Object.entries(info.state.subjects ?? {}).map(([subject, count]) => {
        const parts = subject.split(".");
        return [`${parts.at(-4)}.${parts.at(-1)}`, count];
      }),
    );
  }

  async function run(name: string, script: string, whileRunning?: (jobId: string) => Promise<void>) {
    await client.applyAgent({ name, command: ["sh", "-c", script], trusted: true, runtime: { sandbox: "host" } });
    const { job } = await client.submit({ agent: name });
    await whileRunning?.(job.id);
    await client.waitForJob(job.id);
    const events = [];
    for await (const e of client.events(job.id)) events.push(e);
    return { id: job.id, events };
  }

  test("an attempt that ends at once stores two messages, its start and its end, and reads back as all its events in order", async () => {
    const { id, events } = await run("quick", "true");
    // Admission stores one more: `queued`, with `accepted` folded into it.
    expect(await storedSubjects(id)).toEqual({ "job.queued": 1, "job.started": 1, "job.succeeded": 1 });
    expect(events.map((e) => `${e.kind}.${e.type}`)).toEqual([
      "job.accepted",
      "job.queued",
      "job.started",
      ...SANDBOX_STEPS,
      "job.succeeded",
    ]);
    // The worker numbers its events; none read back still carries the others.
    expect(events.slice(2).map((e) => (e.kind === "job" || e.kind === "sandbox" ? e.seq : undefined))).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(events.some((e) => e.kind === "job" && e.folded !== undefined)).toBe(false);
  });

  test("a longer attempt stores each event as it happens, so followers see it start", async () => {
    const { id, events } = await run("longer", "sleep 4", async (jobId) => {
      await eventually(async () => {
        const seen: string[] = [];
        for await (const e of client.events(jobId)) seen.push(e.type);
        return seen.includes("exec_started") ? true : undefined;
      }, "the agent's start to be stored while it runs");
      expect((await client.getJob(jobId)).state).toBe("running");
    });
    expect(await storedSubjects(id)).toEqual({
      "job.queued": 1,
      "job.started": 1,
      "sandbox.creating": 1,
      "sandbox.ready": 1,
      "sandbox.exec_started": 1,
      "sandbox.exec_exited": 1,
      "sandbox.destroyed": 1,
      "job.succeeded": 1,
    });
    expect(events.map((e) => `${e.kind}.${e.type}`)).toEqual([
      "job.accepted",
      "job.queued",
      "job.started",
      ...SANDBOX_STEPS,
      "job.succeeded",
    ]);
  });
});
