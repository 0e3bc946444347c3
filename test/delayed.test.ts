/**
 * Delayed jobs (issue 21, part 3's first half): `delay` and `runAt` on submit, against a real
 * nats-server, dispatchers and a worker in this process: a delayed job waits off the pools'
 * consumers, does not start before its time and then runs; its queue timeout counts from its
 * time; a dispatcher that restarts meanwhile changes nothing; cancelling it before its time ends
 * it and removes its marker; bad values are refused, naming the field.
 */

import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode } from "@boxcar/protocol";
import { natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

const agent = { name: "later", command: "echo ran", trusted: true, runtime: { sandbox: "host" } } as const;

test("a delayed job waits off the pools, through a dispatcher's restart, and then runs, not before its time; its queue timeout counts from then", async () => {
  await using nats = await natsFixture();
  const first = await startDispatcher({ ...nats.dispatcherRole, expiryIntervalMs: 100 });
  const client = createClient(nats.topology);
  await client.applyAgent(agent);
  await using _w = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void _w.run();

  // A queue timeout shorter than the delay: it counts from the job's time, so the job runs.
  const { job } = await client.submit({ agent: "later", delay: "2s", queueTimeout: "30s" });
  expect(Date.parse(job.runAt as string) - Date.parse(job.createdAt)).toBe(2_000);
  expect(Date.parse(job.expiresAt as string) - Date.parse(job.runAt as string)).toBe(30_000);
  const at = new Date(Date.now() + 2_500).toISOString();
  const { job: atTime } = await client.submit({ agent: "later", runAt: at });
  expect(atTime.runAt).toBe(at);

  // While they wait, no pool's consumer holds them: the workers see nothing of them.
  await new Promise((r) => setTimeout(r, 500));
  expect((await client.getJob(job.id)).state).toBe("queued");
  const pool = await nats.topology.jsm.consumers.info(nats.topology.names.streams.work, nats.topology.names.poolConsumer("default"));
  expect(pool.num_pending + pool.num_ack_pending).toBe(0);
  // The dispatcher that handled their markers goes; another comes.
  await first.close();
  await using _d = await startDispatcher({ ...nats.dispatcherRole, expiryIntervalMs: 100 });

  for (const delayed of [job, atTime]) {
    const done = await client.waitForJob(delayed.id);
    expect(done.state).toBe("succeeded");
    // Not before its time (the attempt's start is the worker's claim, on this machine's clock).
    expect(Date.parse(done.startedAt as string)).toBeGreaterThanOrEqual(Date.parse(delayed.runAt as string));
  }
});

test("a delayed job cancelled before its time ends cancelled and never runs; bad delays are refused", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  await using worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  await client.applyAgent(agent);

  const { job } = await client.submit({ agent: "later", delay: "1h" });
  const marker = nats.topology.names.subjects.laterWork(job.id);
  const markers = async () =>
    (await nats.topology.jsm.streams.info(nats.topology.names.streams.work, { subjects_filter: marker })).state.subjects?.[marker] ?? 0;
  expect(await markers()).toBe(1);
  await client.cancelJob(job.id);
  expect(await client.waitForJob(job.id)).toMatchObject({ state: "cancelled", attempt: 0 });
  // Its marker does not wait in the stream for its hour.
  expect(await markers()).toBe(0);

  await expect(client.submit({ agent: "later", delay: "1s", runAt: new Date().toISOString() })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "delay", message: "give runAt or delay, not both" })],
  });
  await expect(client.submit({ agent: "later", delay: "31d" })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "delay" })],
  });
  await expect(client.submit({ agent: "later", runAt: new Date(Date.now() + 31 * 86_400_000).toISOString() })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "runAt" })],
  });
  await expect(client.submit({ agent: "later", delay: "1m", deadline: "30s" })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "deadline" })],
  });
  await expect(client.submit({ agent: "later", runAt: "tomorrow" })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "runAt" })],
  });
  // An agent removed while its job waits: the job fails at its time, saying so.
  await client.applyAgent({ ...agent, name: "gone-later" });
  const { job: orphan } = await client.submit({ agent: "gone-later", delay: "1s" });
  await client.removeAgent("gone-later");
  expect(await client.waitForJob(orphan.id)).toMatchObject({ state: "failed", error: { code: ErrorCode.unknownAgent } });
  // A time already passed runs now.
  const past = await client.submit({ agent: "later", runAt: new Date(Date.now() - 60_000).toISOString() });
  expect(past.job.runAt).toBeUndefined();
  expect((await client.waitForJob(past.job.id)).state).toBe("succeeded");

  // From the command line: --delay, and the status says when it runs.
  const submitted = await boxcar(nats.url, nats.topology.names.prefix, ["submit", "later", "--delay", "1h", "--json"]);
  expect(submitted.code).toBe(0);
  const id = (JSON.parse(submitted.stdout) as { job: { id: string } }).job.id;
  const status = await boxcar(nats.url, nats.topology.names.prefix, ["status", id]);
  expect(status.stdout).toMatch(/runs at\s+\d{4}-\d\d-\d\dT/);
  const bad = await boxcar(nats.url, nats.topology.names.prefix, ["submit", "later", "--delay", "soon"]);
  expect(bad.code).not.toBe(0);
  expect(bad.stderr).toMatch(/delay/);
});
