/**
 * Schedules (issue 21, part 3): a schedule submits its job at each tick of its cron expression,
 * once per tick however many dispatchers run, through the kill of one, with its overlap and
 * catch-up policies; against a real nats-server, dispatcher processes and a host worker.
 */

import { type BoxcarClient, createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode, type JobRecord, type ScheduleDefinitionInput } from "@boxcar/protocol";
import { eventually, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { securedSystem } from "./helpers/secured.js";

const quick = { command: "true", trusted: true, runtime: { sandbox: "host" as const } };

/** The jobs `client` sees of one schedule, oldest tick first. */
async function jobsOf(client: BoxcarClient, schedule: string): Promise<JobRecord[]> {
  const jobs: JobRecord[] = [];
  let after: string | undefined;
  do {
    const page = await client.listJobs({ limit: 1000, ...(after ? { after } : {}) });
    jobs.push(...page.jobs.filter((j) => j.schedule?.name === schedule));
    after = page.next;
  } while (after);
  return jobs.sort((a, b) => Date.parse(a.schedule?.tick ?? "") - Date.parse(b.schedule?.tick ?? ""));
}

/** Waits until `ms` after the next multiple of `periodMs` since the epoch (the cron's ticks below are multiples). */
async function untilAfterTick(periodMs: number, ms: number): Promise<number> {
  const tick = Math.ceil(Date.now() / periodMs) * periodMs;
  await new Promise((r) => setTimeout(r, tick + ms - Date.now()));
  return tick;
}

test("a schedule fires exactly once per tick with two dispatcher processes, one killed mid-way", async () => {
  await using nats = await natsFixture();
  const client = createClient(nats.topology);
  const prefix = nats.topology.names.prefix;
  await using worker = createWorker({ ...nats.workerRole, concurrency: 8, providers: [createHostSandboxProvider()] });
  void worker.run();
  const dispatchers = [0, 1].map(() => spawnBoxcar(nats.url, prefix, ["dispatcher"]));
  try {
    await eventually(() => client.listAgents().catch(() => undefined), "a dispatcher to answer");
    await client.applyAgent({ name: "tick", ...quick });
    const created = await client.createSchedule({ name: "every-2s", cron: "*/2 * * * * *", job: { agent: "tick" }, overlap: "allow" });
    expect(created.next).toBeDefined();
    // Five or six ticks with both, then as many with one.
    await new Promise((r) => setTimeout(r, 11_000));
    const killed = dispatchers[0];
    killed?.kill("SIGKILL");
    if (killed) await exited(killed);
    await new Promise((r) => setTimeout(r, 11_000));
    const paused = await client.pauseSchedule("every-2s");
    expect(paused.paused).toBe(true);
    // What was claimed before the pause is admitted (a claim's job may come a moment after).
    await new Promise((r) => setTimeout(r, 7_000));

    const jobs = await jobsOf(client, "every-2s");
    const ticks = jobs.map((j) => Date.parse(j.schedule?.tick ?? ""));
    expect(new Set(ticks).size).toBe(ticks.length); // never twice
    expect(ticks.length).toBeGreaterThanOrEqual(10);
    for (let i = 1; i < ticks.length; i++) expect((ticks[i] as number) - (ticks[i - 1] as number)).toBe(2_000); // never a gap
    const final = await client.getSchedule("every-2s");
    expect(final.state).toMatchObject({ fired: ticks.length, skipped: 0 });
    for (const job of jobs) expect((await client.waitForJob(job.id)).state).toBe("succeeded");
  } finally {
    for (const d of dispatchers) d.kill("SIGTERM");
    for (const d of dispatchers) await exited(d);
  }
}, 120_000);

test("after the dispatchers are down for three ticks, catch-up fires none, the last or all of them, as configured", async () => {
  await using nats = await natsFixture();
  const client = createClient(nats.topology);
  await using worker = createWorker({ ...nats.workerRole, concurrency: 8, providers: [createHostSandboxProvider()] });
  void worker.run();
  let dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  await client.applyAgent({ name: "tick", ...quick });
  for (const catchUp of ["none", "last", "all"] as const) {
    await client.createSchedule({ name: `catch-up-${catchUp}`, cron: "*/6 * * * * *", job: { agent: "tick" }, overlap: "allow", catchUp });
  }
  // Down from 1.5 s after a tick until 3.5 s after the third tick it missed: late enough for
  // that one to be missed (3 s is half the period), with 2.5 s left before the next.
  const lastSeen = await untilAfterTick(6_000, 1_500);
  await dispatcher.close();
  const missed = [lastSeen + 6_000, lastSeen + 12_000, lastSeen + 18_000];
  await new Promise((r) => setTimeout(r, lastSeen + 18_000 + 3_500 - Date.now()));
  dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  try {
    // Past the next tick, so each fires on time after the downtime too.
    await new Promise((r) => setTimeout(r, lastSeen + 24_000 + 1_500 - Date.now()));
    for (const catchUp of ["none", "last", "all"]) await client.pauseSchedule(`catch-up-${catchUp}`);
    await new Promise((r) => setTimeout(r, 1_000));
    const fired = async (name: string) =>
      (await jobsOf(client, name)).map((j) => Date.parse(j.schedule?.tick ?? "")).filter((t) => missed.includes(t));
    expect(await fired("catch-up-none")).toEqual([]);
    expect(await fired("catch-up-last")).toEqual([missed[2]]);
    expect(await fired("catch-up-all")).toEqual(missed);
    expect((await client.getSchedule("catch-up-none")).state.missed).toBe(3);
    expect((await client.getSchedule("catch-up-last")).state.missed).toBe(2);
    // Before the downtime and after it, each fired on time.
    for (const catchUp of ["none", "last", "all"]) {
      const ticks = (await jobsOf(client, `catch-up-${catchUp}`)).map((j) => Date.parse(j.schedule?.tick ?? ""));
      expect(ticks).toContain(lastSeen);
      expect(ticks).toContain(lastSeen + 24_000);
    }
  } finally {
    await dispatcher.close();
  }
}, 90_000);

test("a tick claimed by a dispatcher that died before noting its job is admitted by another: once, whether or not its job was", async () => {
  await using nats = await natsFixture();
  const client = createClient(nats.topology);
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  await client.applyAgent({ name: "tick", ...quick });
  // A yearly schedule: no tick of its own comes during the test.
  await client.createSchedule({ name: "yearly", cron: "0 0 1 1 *", job: { agent: "tick" } });
  const bucket = await nats.topology.schedules();
  const claim = async (tick: string) => {
    const entry = await bucket.get("local.yearly");
    const record = JSON.parse(entry?.string() ?? "{}");
    await bucket.put("local.yearly", JSON.stringify({ ...record, state: { ...record.state, tick, action: "fired", firing: tick } }));
  };
  const noted = (tick: string) =>
    eventually(async () => {
      const { state } = await client.getSchedule("yearly");
      return state.jobTick === tick && state.firing === undefined ? state : undefined;
    }, `tick ${tick}'s job to be noted`);
  // Claimed, its job never admitted.
  const tick = "2026-01-01T00:00:00.000Z";
  await claim(tick);
  const first = await noted(tick);
  // Claimed again as though the note were lost after the admission: the same job.
  await claim(tick);
  const again = await noted(tick);
  expect(again.jobId).toBe(first.jobId);
  expect((await jobsOf(client, "yearly")).map((j) => j.id)).toEqual([first.jobId]);
});

test("a schedule's job is a submit of its owner's: no pool of its choosing, no input files, its quota; a refusal every tick would meet pauses it", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  await admin.client.applyAgent({ name: "tick", ...quick });
  await expect(alice.client.createSchedule({ name: "s", cron: "* * * * *", job: { agent: "tick", pool: "gpu" } })).rejects.toMatchObject({
    code: ErrorCode.forbidden,
  });
  await expect(
    alice.client.createSchedule({
      name: "s",
      cron: "* * * * *",
      job: { agent: "tick", files: [{ path: "a.txt", object: "inputs/alice/a" }] },
    }),
  ).rejects.toMatchObject({ code: ErrorCode.invalid, issues: [expect.objectContaining({ path: "definition.job.files" })] });
  await expect(alice.client.createSchedule({ name: "s", cron: "0 0 0 1 1 * 2030", job: { agent: "tick" } })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "definition.cron" })],
  });

  // Over her quota: each tick's job is refused (recorded rejected, naming the schedule), and it goes on.
  await admin.client.setPolicy({ quotas: { users: { alice: { queued: 0 } } } });
  await alice.client.createSchedule({ name: "quota", cron: "* * * * * *", job: { agent: "tick" } });
  const refused = await eventually(async () => {
    const jobs = await jobsOf(alice.client, "quota");
    return jobs.length >= 2 ? jobs : undefined;
  }, "two ticks refused");
  expect(refused.every((j) => j.state === "rejected" && j.error?.code === ErrorCode.quotaExceeded)).toBe(true);
  expect(await alice.client.getSchedule("quota")).toMatchObject({ paused: false, state: { lastError: { code: ErrorCode.quotaExceeded } } });
  await alice.client.deleteSchedule("quota");
  await admin.client.setPolicy({});

  // Its agent removed: the next tick is refused, and the schedule pauses.
  await alice.client.createSchedule({ name: "orphan", cron: "* * * * * *", job: { agent: "tick" } });
  await admin.client.removeAgent("tick");
  const paused = await eventually(async () => {
    const s = await alice.client.getSchedule("orphan");
    return s.paused ? s : undefined;
  }, "the schedule to pause");
  expect(paused.state.lastError?.code).toBe(ErrorCode.unknownAgent);
});

test("overlap: skip leaves out ticks while the last job runs; queue-one runs one when it ends", async () => {
  await using nats = await natsFixture();
  const client = createClient(nats.topology);
  await using worker = createWorker({ ...nats.workerRole, concurrency: 8, providers: [createHostSandboxProvider()] });
  void worker.run();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  await client.applyAgent({ name: "slow", ...quick, command: "sleep 2.5" });
  await client.createSchedule({ name: "skipper", cron: "* * * * * *", job: { agent: "slow" }, overlap: "skip" });
  await client.createSchedule({ name: "queuer", cron: "* * * * * *", job: { agent: "slow" }, overlap: "queue-one" });
  await new Promise((r) => setTimeout(r, 9_000));
  for (const name of ["skipper", "queuer"]) await client.pauseSchedule(name);
  const ended = async (name: string) => Promise.all((await jobsOf(client, name)).map((j) => client.waitForJob(j.id)));

  const skipped = await ended("skipper");
  expect(skipped.length).toBeGreaterThanOrEqual(2);
  // Never two at once: each started after the one before ended.
  for (let i = 1; i < skipped.length; i++) {
    expect(Date.parse(skipped[i]?.startedAt as string)).toBeGreaterThanOrEqual(Date.parse(skipped[i - 1]?.finishedAt as string));
  }
  expect((await client.getSchedule("skipper")).state.skipped).toBeGreaterThan(0);

  const queued = await ended("queuer");
  expect(queued.length).toBeGreaterThanOrEqual(2);
  for (let i = 1; i < queued.length; i++) {
    const previousEnd = Date.parse(queued[i - 1]?.finishedAt as string);
    // One after another, the next submitted as soon as the one before ended (its tick waited).
    expect(Date.parse(queued[i]?.startedAt as string)).toBeGreaterThanOrEqual(previousEnd);
    expect(Date.parse(queued[i]?.createdAt as string) - previousEnd).toBeLessThan(1_000);
  }
});

test("schedules through the API: time zones, refusals naming the field, pause and resume, another user's, delete", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  const bob = await system.as("bob");
  await admin.client.applyAgent({ name: "report", ...quick });

  const tokyo = await alice.client.createSchedule({ name: "morning", cron: "0 9 * * *", timezone: "Asia/Tokyo", job: { agent: "report" } });
  // 09:00 in Tokyo is 00:00 UTC.
  expect(tokyo.next).toMatch(/T00:00:00\.000Z$/);
  expect(tokyo.definition).toMatchObject({ overlap: "skip", catchUp: "last" });

  const refused = async (definition: ScheduleDefinitionInput, path: string, code: string = ErrorCode.invalid) =>
    expect(alice.client.createSchedule(definition)).rejects.toMatchObject({
      code,
      ...(code === ErrorCode.invalid ? { issues: [expect.objectContaining({ path })] } : {}),
    });
  const job = { agent: "report" };
  await refused({ name: "bad", cron: "61 * * * *", job }, "definition.cron");
  await refused({ name: "bad", cron: "* * * * *", timezone: "Mars/Base", job }, "definition.timezone");
  await refused({ name: "bad", cron: "* * * * *", job: { agent: "report", delay: "1m" } }, "definition.job.delay");
  await refused({ name: "bad", cron: "* * * * *", job: { agent: "nobody" } }, "", ErrorCode.unknownAgent);
  await refused({ name: "morning", cron: "* * * * *", job }, "", ErrorCode.conflict);

  // Another user's schedule is not found; an admin sees and names it.
  await expect(bob.client.getSchedule("morning")).rejects.toMatchObject({ code: ErrorCode.notFound });
  await expect(bob.client.getSchedule("morning", "alice")).rejects.toMatchObject({ code: ErrorCode.notFound });
  expect(await bob.client.listSchedules()).toEqual([]);
  expect((await admin.client.listSchedules()).map((s) => `${s.owner}.${s.definition.name}`)).toEqual(["alice.morning"]);
  expect((await admin.client.pauseSchedule("morning", "alice")).paused).toBe(true);
  expect((await alice.client.getSchedule("morning")).next).toBeUndefined();
  const resumed = await alice.client.resumeSchedule("morning");
  expect(resumed).toMatchObject({ paused: false, next: tokyo.next });
  expect(resumed.resumedAt).toBeDefined();

  await expect(bob.client.deleteSchedule("morning", "alice")).rejects.toMatchObject({ code: ErrorCode.notFound });
  await alice.client.deleteSchedule("morning");
  await expect(alice.client.getSchedule("morning")).rejects.toMatchObject({ code: ErrorCode.notFound });
});

test("a schedule updated in place keeps its history and its name; its new cron rules from then on; another user's is not found", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  const bob = await system.as("bob");
  await admin.client.applyAgent({ name: "tick", ...quick });
  await alice.client.createSchedule({ name: "often", cron: "* * * * * *", job: { agent: "tick" } });
  const fired = await eventually(async () => {
    const s = await alice.client.getSchedule("often");
    return s.state.fired >= 2 ? s : undefined;
  }, "two ticks fired");

  // Through the CLI, as a user would: the whole definition again, with a yearly cron.
  const updated = await boxcar(system.url, system.prefix, ["schedule", "update", "often", "--agent", "tick", "--cron", "0 0 1 1 *"], {
    NATS_CREDS: alice.creds,
  });
  expect(updated.code, updated.stderr).toBe(0);
  expect(updated.stdout).toMatch(/^schedule often updated; it fires next at \d{4}-01-01T00:00:00\.000Z$/m);
  const after = await alice.client.getSchedule("often");
  expect(after.definition.cron).toBe("0 0 1 1 *");
  expect(after.createdAt).toBe(fired.createdAt);
  expect(after.resumedAt).toBeDefined();
  expect(after.state.fired).toBeGreaterThanOrEqual(fired.state.fired);
  // Its every-second ticks are over: no job comes of it in the next two seconds.
  const jobs = (await jobsOf(alice.client, "often")).length;
  await new Promise((r) => setTimeout(r, 2_000));
  expect((await jobsOf(alice.client, "often")).length).toBe(jobs);

  await expect(bob.client.updateSchedule({ name: "often", cron: "* * * * *", job: { agent: "tick" } })).rejects.toMatchObject({
    code: ErrorCode.notFound,
  });
  await expect(alice.client.updateSchedule({ name: "never-made", cron: "* * * * *", job: { agent: "tick" } })).rejects.toMatchObject({
    code: ErrorCode.notFound,
  });
  await expect(alice.client.updateSchedule({ name: "often", cron: "61 * * * *", job: { agent: "tick" } })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "definition.cron" })],
  });
  await alice.client.deleteSchedule("often");
});
