import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { SandboxBackend } from "@boxcar/protocol";
import { createWorker, type Worker } from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { eventually } from "./helpers/cli.js";
import { boxcarContainers, dockerReady } from "./helpers/docker.js";
import { type NatsFixture, natsFixture } from "./helpers/nats.js";

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
