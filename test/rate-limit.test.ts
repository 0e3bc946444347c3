/**
 * Rate limits (issue 21, part 2's first half): an agent's `rateLimit` spaces its jobs' starts
 * across every dispatcher, against a real nats-server, two dispatchers and a worker in this
 * process. The limit is checked on the start times the dispatchers reserved (a job never starts
 * before its own), so it does not depend on how fast this machine runs them.
 */

import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode, type JobRecord } from "@boxcar/protocol";
import { eventually, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";

/** A nats-server, two dispatchers and a host worker of 8 slots, and a client. */
async function twoDispatchers() {
  const nats = await natsFixture();
  const dispatchers = [await startDispatcher({ ...nats.dispatcherRole }), await startDispatcher({ ...nats.dispatcherRole })];
  const worker = createWorker({ ...nats.workerRole, concurrency: 8, providers: [createHostSandboxProvider()] });
  void worker.run();
  return {
    nats,
    client: createClient(nats.topology),
    async [Symbol.asyncDispose]() {
      await worker.close();
      for (const d of dispatchers) await d.close();
      await nats[Symbol.asyncDispose]();
    },
  };
}

/** When a job was let start: its reserved time, or its admission when it could start at once. */
const releasedAt = (job: JobRecord) => Date.parse(job.runAt ?? job.createdAt);

test("a rate-limited agent's jobs, submitted at once through two dispatchers, are let start per its limit and all run", async () => {
  await using system = await twoDispatchers();
  const { client } = system;
  await client.applyAgent({
    name: "limited",
    command: "true",
    trusted: true,
    runtime: { sandbox: "host" },
    rateLimit: { starts: 4, per: "2s" },
  });
  const submitted = await Promise.all(Array.from({ length: 12 }, () => client.submit({ agent: "limited" })));
  const jobs = submitted.map((s) => s.job).sort((a, b) => releasedAt(a) - releasedAt(b));
  // Evenly spaced, 500 ms apart: any 5 in a row span at least the 2 s period (a few ms of the
  // admissions' own clocks aside for the first, which started at once).
  for (let i = 0; i + 4 < jobs.length; i++) {
    expect(releasedAt(jobs[i + 4] as JobRecord) - releasedAt(jobs[i] as JobRecord)).toBeGreaterThanOrEqual(1_990);
  }
  const done = await Promise.all(jobs.map((j) => client.waitForJob(j.id)));
  for (const [i, job] of done.entries()) {
    expect(job.state).toBe("succeeded");
    expect(Date.parse(job.startedAt as string)).toBeGreaterThanOrEqual(Date.parse(jobs[i]?.runAt ?? jobs[i]?.createdAt ?? ""));
  }
});

test("a burst lets that many start at once after a quiet spell, then spaces the rest; a bad limit is refused, naming the field", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent({
    name: "bursty",
    command: "true",
    trusted: true,
    runtime: { sandbox: "host" },
    rateLimit: { starts: 3, per: "3s", burst: 3 },
  });
  const jobs: JobRecord[] = [];
  for (let i = 0; i < 5; i++) jobs.push((await client.submit({ agent: "bursty" })).job);
  // Three at once (no wait), then one a second.
  expect(jobs.slice(0, 3).map((j) => j.runAt)).toEqual([undefined, undefined, undefined]);
  const first = Date.parse(jobs[0]?.createdAt as string);
  expect(Date.parse(jobs[3]?.runAt as string) - first).toBeGreaterThanOrEqual(950);
  expect(Date.parse(jobs[4]?.runAt as string) - Date.parse(jobs[3]?.runAt as string)).toBe(1_000);

  await expect(client.applyAgent({ name: "bad", command: "true", rateLimit: { starts: 2, per: "1s", burst: 3 } })).rejects.toMatchObject({
    code: ErrorCode.invalid,
    issues: [expect.objectContaining({ path: "definition.rateLimit.burst" })],
  });
  await expect(client.applyAgent({ name: "bad", command: "true", rateLimit: { starts: 0, per: "1s" } })).rejects.toMatchObject({
    code: ErrorCode.invalid,
  });
});

test("a delayed job takes its turn at its time, holding up no one before; a start past the deadline is refused; a changed limit starts afresh; 200 submits at once are all admitted", async () => {
  await using system = await twoDispatchers();
  const { client } = system;
  const limited = (rateLimit: { starts: number; per: string }) =>
    client.applyAgent({ name: "slow", command: "true", trusted: true, runtime: { sandbox: "host" }, rateLimit });
  await limited({ starts: 1, per: "2s" });

  // A job delayed an hour reserves nothing now: the next job starts at once.
  const { job: far } = await client.submit({ agent: "slow", delay: "1h" });
  const { job: first } = await client.submit({ agent: "slow" });
  expect(first.runAt).toBeUndefined();
  // A job delayed half a second takes the turn after `first`'s when its time comes: 2 s after it.
  const { job: soon } = await client.submit({ agent: "slow", delay: "500ms" });
  const ran = await client.waitForJob(soon.id);
  expect(ran.state).toBe("succeeded");
  expect(Date.parse(ran.startedAt as string) - Date.parse(first.createdAt)).toBeGreaterThanOrEqual(1_900);
  // The next turn is 2 s away: a job that must end within 1 s is refused, not queued to time out.
  await expect(client.submit({ agent: "slow", deadline: "1s" })).rejects.toMatchObject({ code: ErrorCode.unavailable });
  await client.cancelJob(far.id);

  // A new limit forgets the old one's schedule.
  await limited({ starts: 1, per: "1m" });
  await client.submit({ agent: "slow" });
  const { job: queued } = await client.submit({ agent: "slow" });
  expect(Date.parse(queued.runAt as string) - Date.now()).toBeGreaterThan(50_000);
  await client.cancelJob(queued.id);
  await limited({ starts: 1_000, per: "1s" });
  // Many at once through two dispatchers: each reservation wins its compare-and-swap in time.
  const many = await Promise.all(Array.from({ length: 200 }, () => client.submit({ agent: "slow" })));
  expect(many).toHaveLength(200);
  const ends = await Promise.all(many.map((s) => client.waitForJob(s.job.id)));
  expect(ends.filter((j) => j.state !== "succeeded")).toEqual([]);
}, 120_000);

test("a limit with a key limits each value on its own: one customer's jobs do not wait for another's", async () => {
  await using system = await twoDispatchers();
  const { client } = system;
  const perCustomer = (rateLimit: { starts: number; per: string; key: string }) =>
    client.applyAgent({ name: "keyed", command: "true", trusted: true, runtime: { sandbox: "host" }, rateLimit });
  await perCustomer({ starts: 1, per: "2s", key: "input.customer.id" });
  const submit = (id: string | undefined) => client.submit({ agent: "keyed", input: id === undefined ? {} : { customer: { id } } });
  const [a1, b1, none1] = await Promise.all([submit("a"), submit("b"), submit(undefined)]);
  const [a2, b2, none2] = await Promise.all([submit("a"), submit("b"), submit(undefined)]);
  // Each customer's (and the jobs without one) first starts at once, the second a period after.
  for (const first of [a1, b1, none1]) expect(first.job.runAt).toBeUndefined();
  for (const [first, second] of [
    [a1, a2],
    [b1, b2],
    [none1, none2],
  ] as const) {
    expect(Date.parse(second.job.runAt as string) - Date.parse(first.job.createdAt)).toBeGreaterThanOrEqual(1_900);
  }
  // A new limit forgets every customer's schedule: customer a, booked until after a2, starts at once.
  await perCustomer({ starts: 1, per: "3s", key: "input.customer.id" });
  const a3 = await submit("a");
  expect(a3.job.runAt).toBeUndefined();
  // A label as the key.
  await perCustomer({ starts: 1, per: "3s", key: "label.tenant" });
  const [x1, y1] = await Promise.all(["x", "y"].map((tenant) => client.submit({ agent: "keyed", labels: { tenant } })));
  expect([x1?.job.runAt, y1?.job.runAt]).toEqual([undefined, undefined]);
  const x2 = await client.submit({ agent: "keyed", labels: { tenant: "x" } });
  expect(Date.parse(x2.job.runAt as string) - Date.parse(x1?.job.createdAt as string)).toBeGreaterThanOrEqual(2_900);
  for (const done of await Promise.all([a2, b2, none2, a3, x2].map((s) => client.waitForJob(s.job.id))))
    expect(done.state).toBe("succeeded");
  // 1 and "1" are one customer; an inherited field (`constructor`) is no value, not a crash.
  await perCustomer({ starts: 1, per: "3s", key: "input.id" });
  const one = await client.submit({ agent: "keyed", input: { id: 1 } });
  expect((await client.submit({ agent: "keyed", input: { id: "1" } })).job.runAt).toBeDefined();
  await perCustomer({ starts: 1, per: "3s", key: "input.constructor" });
  expect((await client.submit({ agent: "keyed", input: {} })).job.runAt).toBeUndefined();
  expect((await client.submit({ agent: "keyed", input: [] })).job.runAt).toBeDefined();
  // The job's user as the key.
  await perCustomer({ starts: 1, per: "3s", key: "owner" });
  expect((await client.submit({ agent: "keyed" })).job.runAt).toBeUndefined();
  expect((await client.submit({ agent: "keyed" })).job.runAt).toBeDefined();
  expect((await client.waitForJob(one.job.id)).state).toBe("succeeded");
  await expect(
    client.applyAgent({ name: "keyed", command: "true", rateLimit: { starts: 1, per: "1s", key: "output.x" } }),
  ).rejects.toMatchObject({ code: ErrorCode.invalid, issues: [expect.objectContaining({ path: "definition.rateLimit.key" })] });
}, 60_000);

test("an agent's report of its provider's 429 pauses its key's limit for the retry-after, and retries the job no sooner; other keys go on", async () => {
  await using system = await twoDispatchers();
  const { client, nats } = system;
  await client.applyAgent({
    name: "caller",
    // The first attempt of a job whose input says so is refused by "the provider", which asks for 2 s.
    command: `if [ "$BOXCAR_ATTEMPT" = 1 ] && grep -q limited "$BOXCAR_INPUT_FILE"; then echo '{"rateLimited":{"retryAfter":2}}' > "$BOXCAR_RESULT_FILE"; fi`,
    trusted: true,
    runtime: { sandbox: "host" },
    retry: { maxAttempts: 2, backoff: "fixed", delay: "10ms", jitter: false },
    rateLimit: { starts: 20, per: "1s", key: "input.customer" },
  });
  const refused = (await client.submit({ agent: "caller", input: { customer: "a", mode: "limited" } })).job;
  // Turns 50 ms apart: these wait for theirs, some past the moment the first job reports.
  const booked = (await Promise.all(Array.from({ length: 30 }, () => client.submit({ agent: "caller", input: { customer: "a" } })))).map(
    (s) => s.job,
  );
  const limits = await nats.topology.limits();
  // The dispatchers pause customer a's limit once they see the report.
  const until = await eventually(async () => {
    for await (const key of await limits.keys("caller.>")) {
      const paused = JSON.parse((await limits.get(key))?.string() ?? "{}").pausedUntil;
      if (typeof paused === "number") return paused;
    }
    return undefined;
  }, "customer a's limit to pause");
  const same = (await client.submit({ agent: "caller", input: { customer: "a" } })).job;
  const other = (await client.submit({ agent: "caller", input: { customer: "b" } })).job;
  expect(Date.parse(same.runAt as string)).toBeGreaterThanOrEqual(until);
  expect(other.runAt).toBeUndefined();

  const [first, second, third] = await Promise.all([refused, same, other].map((j) => client.waitForJob(j.id)));
  expect(first).toMatchObject({ state: "succeeded", attempt: 2, history: [{ error: { code: ErrorCode.rateLimited } }] });
  // Its report goes with the attempt that made it.
  expect(first?.providerLimitedUntil).toBeUndefined();
  // The refused job is retried no sooner than its provider asked, and so is its customer's next.
  expect(Date.parse(first?.startedAt as string)).toBeGreaterThanOrEqual(until);
  expect(Date.parse(second?.startedAt as string)).toBeGreaterThanOrEqual(until);
  expect(Date.parse(third?.startedAt as string)).toBeLessThan(until);
  // A job whose turn came during the pause took a new one after it (the pause is written a
  // moment after the report, 2 s before its end: what was due by then may have started).
  const late = booked.filter((j) => Date.parse(j.runAt ?? j.createdAt) > until - 1_500);
  expect(late.length).toBeGreaterThan(0);
  for (const job of await Promise.all(late.map((j) => client.waitForJob(j.id)))) {
    expect(Date.parse(job.startedAt as string)).toBeGreaterThanOrEqual(until);
  }
});

test("a limit holds within 10% over one minute: 3 starts a second, 200 jobs submitted at once", async () => {
  await using system = await twoDispatchers();
  const { client } = system;
  await client.applyAgent({
    name: "steady",
    command: "true",
    trusted: true,
    runtime: { sandbox: "host" },
    rateLimit: { starts: 3, per: "1s" },
  });
  const jobs = (await Promise.all(Array.from({ length: 200 }, () => client.submit({ agent: "steady" })))).map((s) => s.job);
  const first = Math.min(...jobs.map((j) => Date.parse(j.runAt ?? j.createdAt)));
  await new Promise((r) => setTimeout(r, first + 61_000 - Date.now()));
  // What started in the minute from the first start, read from the records; the rest is cancelled.
  const records = await Promise.all(jobs.map((j) => client.getJob(j.id)));
  for (const job of records) if (job.state === "queued") await client.cancelJob(job.id).catch(() => undefined);
  const started = records.filter((j) => j.startedAt !== undefined && Date.parse(j.startedAt) < first + 60_000).length;
  expect(started).toBeGreaterThanOrEqual(162);
  expect(started).toBeLessThanOrEqual(198);
}, 120_000);
