import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { eventually, natsFixture } from "@boxcar/testing";
import { createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { exited, spawnBoxcar } from "./helpers/cli.js";
import { waitGone } from "./helpers/process.js";

/** An agent that starts a background grandchild, prints its pid, and waits on it. */
const treeAgent = (name: string, sleepSeconds: number, timeout: string) => ({
  name,
  command: ["sh", "-c", `sleep ${sleepSeconds} & echo "grandchild=$!"; wait`],
  trusted: true,
  runtime: { sandbox: "host", timeout },
});

async function grandchildPids(client: ReturnType<typeof createClient>, jobId: string): Promise<number[]> {
  let text = "";
  for await (const chunk of client.logs(jobId)) text += new TextDecoder().decode(chunk.data);
  return [...text.matchAll(/grandchild=(\d+)/g)].map((m) => Number(m[1]));
}

test("a timeout kills the whole process tree and the job ends timed_out", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  await using worker = createWorker({ ...nats.workerRole });
  void worker.run();
  const client = createClient(nats.topology);
  await client.applyAgent(treeAgent("stuck", 1000, "1s"));

  const { job } = await client.submit({ agent: "stuck" });
  const final = await client.waitForJob(job.id);
  expect(final.state).toBe("timed_out");
  expect(final.error?.code).toBe("timed_out");
  const [pid] = await grandchildPids(client, job.id);
  expect(pid).toBeGreaterThan(0);
  expect(await waitGone(pid as number)).toBe(true);
});

test("SIGTERM on a worker lets a short job finish within the grace period", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(treeAgent("short", 2, "1m"));
  const child = spawnBoxcar(nats.url, nats.topology.names.prefix, ["worker", "--drain-grace", "30s"]);
  try {
    const { job } = await client.submit({ agent: "short" });
    await eventually(async () => ((await client.getJob(job.id)).state === "running" ? true : undefined), "the job to start");
    child.kill("SIGTERM");
    const final = await client.waitForJob(job.id);
    expect(final.state).toBe("succeeded");
    expect(final.attempt).toBe(1);
    expect(await exited(child)).toEqual({ code: 0, signal: null });
    expect(await client.listWorkers()).toEqual([]);
  } finally {
    child.kill("SIGKILL");
  }
});

test("SIGTERM past the grace period hands the job back; another worker completes it and no process is orphaned", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(treeAgent("long", 4, "1m"));
  const child = spawnBoxcar(nats.url, nats.topology.names.prefix, ["worker", "--drain-grace", "500ms"]);
  try {
    const { job } = await client.submit({ agent: "long" });
    await eventually(async () => ((await client.getJob(job.id)).state === "running" ? true : undefined), "the job to start");
    await eventually(async () => ((await grandchildPids(client, job.id)).length > 0 ? true : undefined), "the agent's output");
    child.kill("SIGTERM");
    expect(await exited(child)).toEqual({ code: 0, signal: null });
    const [firstPid] = await grandchildPids(client, job.id);
    expect(await waitGone(firstPid as number)).toBe(true);
    const requeued = await client.getJob(job.id);
    expect(requeued.state).toBe("queued");

    await using second = createWorker({ ...nats.workerRole });
    void second.run();
    const final = await client.waitForJob(job.id);
    expect(final.state).toBe("succeeded");
    expect(final.workerId).toBe(second.id);
    expect(final.attempt).toBe(2);
    const types = [];
    for await (const e of client.events(job.id)) if (e.kind === "job") types.push(e.type);
    expect(types).toEqual(["accepted", "queued", "started", "requeued", "started", "succeeded"]);
  } finally {
    child.kill("SIGKILL");
  }
});
