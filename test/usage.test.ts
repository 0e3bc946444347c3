/**
 * Usage and budgets (issue 21, part 5): agents report what their calls used; it is summed per
 * job, agent, user and day, once however many dispatchers run, and a spent budget refuses new
 * jobs (or stops running ones); against a real nats-server, dispatchers and a host worker.
 */

import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode, type JobRecord } from "@boxcar/protocol";
import { eventually, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { Registry } from "prom-client";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";
import { securedSystem } from "./helpers/secured.js";

/** An agent that reports two calls (0.75 all told), a line that is no JSON and one that is no usage. */
const reporting = {
  name: "caller",
  command: `printf '%s\\n' '{"model":"m1","tokensIn":100,"tokensOut":20,"cost":0.5}' 'not json' '{"tokensIn":-5}' '{"model":"m2","tokensIn":10,"tokensOut":2,"cost":0.25}' >> "$BOXCAR_USAGE_FILE"`,
  trusted: true,
  runtime: { sandbox: "host" as const },
};

test("usage reported by agents is summed per job (its attempts too), per agent and per user for the day; status, events, boxcar usage and the metrics show it", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  const bob = await system.as("bob");
  await admin.client.applyAgent(reporting);
  // Its first attempt reports a call and fails; the second reports one and succeeds.
  await admin.client.applyAgent({
    name: "twice",
    command: `echo '{"tokensIn":7,"tokensOut":3,"cost":1}' >> "$BOXCAR_USAGE_FILE"; test "$BOXCAR_ATTEMPT" -ge 2`,
    trusted: true,
    runtime: { sandbox: "host" },
    retry: { maxAttempts: 2, delay: "10ms", backoff: "fixed" },
  });
  const jobs: JobRecord[] = [];
  for (const p of [alice, alice, bob]) jobs.push((await p.client.submit({ agent: "caller" })).job);
  const retried = (await bob.client.submit({ agent: "twice" })).job;
  const [one] = await Promise.all(jobs.map((j) => admin.client.waitForJob(j.id)));
  expect(one?.usage).toEqual({
    calls: 2,
    tokensIn: 110,
    tokensOut: 22,
    cost: 0.75,
    models: { m1: { calls: 1, tokensIn: 100, tokensOut: 20, cost: 0.5 }, m2: { calls: 1, tokensIn: 10, tokensOut: 2, cost: 0.25 } },
  });
  expect(await admin.client.waitForJob(retried.id)).toMatchObject({ state: "succeeded", attempt: 2, usage: { calls: 2, cost: 2 } });

  // Summed per day, agent and user, as the dispatchers see the usage events.
  const day = new Date().toISOString().slice(0, 10);
  const report = await eventually(async () => {
    const r = await admin.client.getUsage();
    return r.agents.twice?.calls === 2 && r.agents.caller?.calls === 6 ? r : undefined;
  }, "the usage to be summed");
  expect(report.day).toBe(day);
  expect(report.agents.caller).toMatchObject({ calls: 6, tokensIn: 330, tokensOut: 66, cost: 2.25 });
  expect(report.users.alice).toMatchObject({ calls: 4, cost: 1.5 });
  expect(report.users.bob).toMatchObject({ calls: 4, cost: 2.75 });
  // A submitter sees its own.
  expect(await alice.client.getUsage()).toEqual({ day, agents: {}, users: { alice: report.users.alice } });

  const usageEvents: unknown[] = [];
  for await (const e of alice.client.events(one?.id as string)) if (e.kind === "job" && e.type === "usage") usageEvents.push(e.usage);
  expect(usageEvents).toEqual([one?.usage]);

  const cli = await boxcar(system.url, system.prefix, ["usage"]);
  expect(cli.stdout).toMatch(/agent\s+caller\s+6\s+330\s+66\s+2\.25/);
  expect(cli.stdout).toMatch(/user\s+alice\s+4/);
  const status = await boxcar(system.url, system.prefix, ["status", one?.id as string]);
  expect(status.stdout).toContain("usage     2 calls: 110 tokens in, 22 out, cost 0.75");
});

test("with two dispatchers each report counts once; a spent budget refuses the next job (budget_exceeded), and a stop budget cancels the running ones", async () => {
  await using nats = await natsFixture();
  const registries = [new Registry(), new Registry()];
  const dispatchers = await Promise.all(registries.map((metrics) => startDispatcher({ ...nats.dispatcherRole, metrics })));
  await using worker = createWorker({ ...nats.workerRole, concurrency: 4, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  try {
    await client.applyAgent({ ...reporting, name: "pricey" });
    await client.applyAgent({
      name: "stopper",
      // With input "spend" it reports a call of 2; otherwise it runs long.
      command: `if grep -q spend "$BOXCAR_INPUT_FILE"; then echo '{"cost":2}' >> "$BOXCAR_USAGE_FILE"; else sleep 60; fi`,
      trusted: true,
      runtime: { sandbox: "host" },
    });
    await client.setPolicy({
      budgets: { agents: { pricey: { cost: 1 }, stopper: { cost: 1, onExceeded: "stop" } } },
    });

    // 0.75, then 1.5: spent.
    for (let i = 0; i < 2; i++) await client.waitForJob((await client.submit({ agent: "pricey" })).job.id);
    await eventually(async () => ((await client.getUsage()).agents.pricey?.cost === 1.5 ? true : undefined), "pricey's usage");
    await expect(client.submit({ agent: "pricey" })).rejects.toMatchObject({
      code: ErrorCode.budgetExceeded,
      message: expect.stringContaining("agent pricey has spent its budget"),
    });
    // Counted once, not once per dispatcher: the sums, and the metrics of both dispatchers together.
    expect((await client.getUsage()).agents.pricey).toMatchObject({ calls: 4, cost: 1.5 });
    let metered = 0;
    for (const registry of registries) {
      const cost = (await registry.getSingleMetric("boxcar_usage_cost_total")?.get())?.values ?? [];
      metered += cost.filter((v) => v.labels.agent === "pricey").reduce((sum, v) => sum + v.value, 0);
    }
    expect(metered).toBe(1.5);

    const long = (await client.submit({ agent: "stopper" })).job;
    await eventually(async () => ((await client.getJob(long.id)).state === "running" ? true : undefined), "the long job to run");
    await client.waitForJob((await client.submit({ agent: "stopper", input: "spend" })).job.id);
    expect(await client.waitForJob(long.id)).toMatchObject({ state: "cancelled" });
    await expect(client.submit({ agent: "stopper" })).rejects.toMatchObject({ code: ErrorCode.budgetExceeded });
  } finally {
    for (const d of dispatchers) await d.close();
  }
});

test("a running agent's calls count as it makes them: its usage is summed before it ends, and a stop budget cancels the job that spends it and those queued to start today", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  await using worker = createWorker({ ...nats.workerRole, concurrency: 2, usageReadMs: 200, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  await client.applyAgent({
    name: "spender",
    // A call, a half-written line (its end comes a second later), then a long wait: only an
    // attempt whose file is read while it runs counts anything before it ends.
    command: `echo '{"model":"m","tokensIn":7,"cost":0.4}' >> "$BOXCAR_USAGE_FILE"; printf '{"cost":' >> "$BOXCAR_USAGE_FILE"; sleep 1; echo '0.8}' >> "$BOXCAR_USAGE_FILE"; sleep 60`,
    trusted: true,
    runtime: { sandbox: "host" },
  });
  await client.setPolicy({ budgets: { agents: { spender: { cost: 1, onExceeded: "stop" } } } });
  // Two more that wait (no worker serves pool "nobody"): one that could start today, one delayed
  // past midnight UTC, when the budget renews.
  const queuedToday = (await client.submit({ agent: "spender", pool: "nobody" })).job;
  const tomorrow = new Date(Date.now() + 86_400_000).toISOString().slice(0, 10);
  const queuedTomorrow = (await client.submit({ agent: "spender", pool: "nobody", runAt: `${tomorrow}T01:00:00.000Z` })).job;
  const { job } = await client.submit({ agent: "spender" });
  // The first call is summed while the job runs; the half-written line is not read as one.
  await eventually(async () => ((await client.getUsage()).agents.spender?.cost === 0.4 ? true : undefined), "the first call summed");
  expect((await client.getJob(job.id)).state).toBe("running");
  expect((await client.getUsage()).agents.spender).toMatchObject({ calls: 1, tokensIn: 7 });
  // The second takes the agent past its budget: the job that spent it is stopped, long before its minute.
  expect(await client.waitForJob(job.id)).toMatchObject({ state: "cancelled" });
  // The job queued to start today is stopped too; the one for tomorrow waits for it.
  expect(await client.waitForJob(queuedToday.id)).toMatchObject({ state: "cancelled" });
  expect((await client.getJob(queuedTomorrow.id)).state).toBe("queued");
  // Stopped, it keeps what it used in its record too.
  expect((await client.getJob(job.id)).usage).toMatchObject({ calls: 2, tokensIn: 7 });
  expect((await client.getUsage()).agents.spender).toMatchObject({ calls: 2, tokensIn: 7 });
  expect((await client.getUsage()).agents.spender?.cost).toBeCloseTo(1.2);
  const reports: { state: string; cost: number | undefined }[] = [];
  for await (const e of client.events(job.id))
    if (e.kind === "job" && e.type === "usage") reports.push({ state: e.state, cost: e.usage?.cost });
  expect(reports).toEqual([
    { state: "running", cost: 0.4 },
    { state: "running", cost: 0.8 },
  ]);
  await expect(client.submit({ agent: "spender" })).rejects.toMatchObject({ code: ErrorCode.budgetExceeded });
}, 30_000);

test("an attempt that fails after its agent ended (too many files to keep) keeps what its calls used, in its record and the sums", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  await using worker = createWorker({ ...nats.workerRole, concurrency: 1, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  await client.applyAgent({
    name: "hoarder",
    command: `echo '{"cost":0.5}' >> "$BOXCAR_USAGE_FILE"; mkdir -p out; for i in $(seq 1001); do : > out/$i; done`,
    trusted: true,
    runtime: { sandbox: "host" },
  });
  const { job } = await client.submit({ agent: "hoarder" });
  const final = await client.waitForJob(job.id);
  expect(final).toMatchObject({ state: "failed", error: { code: ErrorCode.tooLarge }, usage: { calls: 1, cost: 0.5 } });
  await eventually(async () => ((await client.getUsage()).agents.hoarder?.cost === 0.5 ? true : undefined), "its call summed");
});
