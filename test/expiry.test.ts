import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode } from "@boxcar/protocol";
import { natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";

const trustedAgent = (name: string, pool: string) => ({ name, pool, command: "echo ran", trusted: true, runtime: { sandbox: "host" } });

async function jobTypes(client: ReturnType<typeof createClient>, jobId: string): Promise<string[]> {
  const types: string[] = [];
  for await (const e of client.events(jobId)) if (e.kind === "job") types.push(e.type);
  return types;
}

test("a job no worker takes within its queue timeout ends expired", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole, expiryIntervalMs: 100 });
  const client = createClient(nats.topology);
  await client.applyAgent(trustedAgent("idle", "nobody"));
  const { job } = await client.submit({ agent: "idle", queueTimeout: "300ms" });
  expect(job.expiresAt).toBeDefined();
  const final = await client.waitForJob(job.id);
  expect(final).toMatchObject({ state: "expired", attempt: 0, error: { code: ErrorCode.expired } });
  expect(await jobTypes(client, job.id)).toEqual(["accepted", "queued", "expired"]);
});

test("a worker that gets a job past its queue timeout ends it expired instead of starting it; one in time runs", async () => {
  await using nats = await natsFixture();
  // The sweeper is slowed right down: only the worker's own check can expire the job here.
  await using _d = await startDispatcher({ ...nats.dispatcherRole, expiryIntervalMs: 600_000 });
  const client = createClient(nats.topology);
  await client.applyAgent(trustedAgent("late", "default"));
  const { job: stale } = await client.submit({ agent: "late", queueTimeout: "200ms" });
  await new Promise((r) => setTimeout(r, 500));
  const { job: fresh } = await client.submit({ agent: "late", queueTimeout: "1m" });

  await using worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  expect(await client.waitForJob(stale.id)).toMatchObject({ state: "expired", attempt: 0 });
  expect(await jobTypes(client, stale.id)).toEqual(["accepted", "queued", "expired"]);
  expect(await client.waitForJob(fresh.id)).toMatchObject({ state: "succeeded", attempt: 1 });
});

test("a queue timeout that is not a duration is refused", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(trustedAgent("x", "default"));
  await expect(client.submit({ agent: "x", queueTimeout: "-1s" })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "queueTimeout" })],
  });
});
