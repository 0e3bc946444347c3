import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode } from "@boxcar/protocol";
import { eventually, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker, type WorkerOptions } from "@boxcar/worker";
import { expect, test } from "vitest";

/** An untrusted agent that asks for `auto`: host sandboxes may run it only under `host: always`. */
const untrusted = { name: "untrusted", command: "echo ran", runtime: { sandbox: "auto" } } as const;

/** Workers here offer only host sandboxes; their policies decide whether they may run the agent. */
const hostWorker = (role: Pick<WorkerOptions, "topology" | "dispatcherKeys">, host: "never" | "trusted" | "always") =>
  createWorker({ ...role, providers: [createHostSandboxProvider()], policy: { host }, heartbeatMs: 300 });

test("a job a worker may not run goes back to the pool for one that may", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(untrusted);
  await using strict = hostWorker(nats.workerRole, "trusted");
  await using lenient = hostWorker(nats.workerRole, "always");
  void strict.run();
  void lenient.run();
  await eventually(async () => ((await client.listWorkers()).length === 2 ? true : undefined), "both workers to be live");

  const ids = await Promise.all(Array.from({ length: 6 }, () => client.submit({ agent: "untrusted" }).then((r) => r.job.id)));
  const finals = await Promise.all(ids.map((id) => client.waitForJob(id)));
  expect(finals.map((j) => [j.state, j.workerId, j.attempt])).toEqual(finals.map(() => ["succeeded", lenient.id, 1]));
  expect(finals[0]?.sandbox?.reason).toMatch(/auto: host/);
});

test("the submitter is told at once when no live worker of the pool may run the agent, and why", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(untrusted);
  await using strict = hostWorker(nats.workerRole, "trusted");
  void strict.run();
  await eventually(async () => ((await client.listWorkers()).length === 1 ? true : undefined), "the worker to be live");
  const workItems = async () => (await nats.topology.jsm.streams.info(nats.topology.names.streams.work)).state.messages;
  const before = await workItems();

  const refused = await client.submit({ agent: "untrusted" }).catch((err: unknown) => err);
  expect(refused).toMatchObject({ code: ErrorCode.noSandbox });
  expect((refused as Error).message).toContain(`no live worker in pool default can run agent untrusted: ${strict.id}`);
  expect((refused as Error).message).toContain("mark the agent `trusted: true`");
  expect(await workItems()).toBe(before);
});

test("with no live worker the job waits; a worker that may not run it, alone, fails it saying what to change", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(untrusted);
  const { job } = await client.submit({ agent: "untrusted" });
  expect(job.state).toBe("queued");

  await using strict = hostWorker(nats.workerRole, "trusted");
  void strict.run();
  const final = await client.waitForJob(job.id);
  expect(final.state).toBe("failed");
  expect(final.error?.code).toBe(ErrorCode.noSandbox);
  expect(final.error?.message).toMatch(/offers host: .*mark the agent `trusted: true`.*host: always/);
});

/** An agent that calls Anthropic through its worker's gateway (here it makes no call: which worker runs it is the point). */
const modelAgent = {
  name: "modeller",
  command: "echo ran",
  runtime: { sandbox: "host" },
  trusted: true,
  models: { providers: ["anthropic"] },
} as const;

/** A host worker holding an Anthropic key (its gateway forwards nowhere: no call is made), or none. */
const modelWorker = (role: Pick<WorkerOptions, "topology" | "dispatcherKeys">, holdsKey: boolean) =>
  createWorker({
    ...role,
    providers: [createHostSandboxProvider()],
    heartbeatMs: 300,
    ...(holdsKey ? { modelGateway: { providers: { anthropic: { key: "sk-test", baseUrl: "http://127.0.0.1:9" } } } } : {}),
  });

test("a job whose provider's key a worker does not hold goes back to the pool for one that holds it", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(modelAgent);
  await using keyless = modelWorker(nats.workerRole, false);
  await using keyed = modelWorker(nats.workerRole, true);
  void keyless.run();
  void keyed.run();
  await eventually(async () => ((await client.listWorkers()).length === 2 ? true : undefined), "both workers to be live");
  expect((await client.listWorkers()).find((w) => w.id === keyed.id)?.models).toEqual({ providers: ["anthropic"], public: false });

  const ids = await Promise.all(Array.from({ length: 6 }, () => client.submit({ agent: modelAgent.name }).then((r) => r.job.id)));
  const finals = await Promise.all(ids.map((id) => client.waitForJob(id)));
  expect(finals.map((j) => [j.state, j.workerId, j.attempt])).toEqual(finals.map(() => ["succeeded", keyed.id, 1]));
});

test("the submitter is told at once when no live worker of the pool holds the agent's provider key; a lone keyless worker that takes it anyway fails it naming the flag", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent(modelAgent);
  // Submitted before any worker is live: accepted, then taken by the only worker there is.
  const { job } = await client.submit({ agent: modelAgent.name });
  await using keyless = modelWorker(nats.workerRole, false);
  void keyless.run();
  const final = await client.waitForJob(job.id);
  expect(final).toMatchObject({ state: "failed", error: { code: ErrorCode.missingSecret } });
  expect(final.error?.message).toContain("--model-key anthropic=VARIABLE");

  // With it live, a submit is refused before anything is kept.
  await eventually(async () => ((await client.listWorkers()).length === 1 ? true : undefined), "the worker to be live");
  const refused = await client.submit({ agent: modelAgent.name }).catch((err: unknown) => err);
  expect(refused).toMatchObject({ code: ErrorCode.noSandbox });
  expect((refused as Error).message).toContain(
    `no live worker in pool default can run agent modeller: ${keyless.id}: this worker holds no key for anthropic`,
  );
});
