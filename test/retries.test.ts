import type { BoxcarClient } from "@boxcar/client";
import { readStream } from "@boxcar/fabric/internal";
import { type BoxcarEvent, ErrorCode, JobRecord } from "@boxcar/protocol";
import { eventually, type LocalSystem, localSystem, type NatsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

let system: LocalSystem;
let client: BoxcarClient;
let nats: NatsFixture;

beforeAll(async () => {
  system = await localSystem();
  client = system.client;
  nats = system.nats;
});
afterAll(async () => {
  await system?.[Symbol.asyncDispose]();
});

/** A trusted host agent with a retry policy that waits 100 ms between attempts. */
async function agent(name: string, script: string, retry: Record<string, unknown>, timeout = "30s") {
  await client.applyAgent({
    name,
    command: ["sh", "-c", script],
    trusted: true,
    runtime: { sandbox: "host", timeout },
    retry: { delay: "100ms", jitter: false, ...retry },
  });
}

async function jobEvents(jobId: string): Promise<BoxcarEvent[]> {
  const events: BoxcarEvent[] = [];
  for await (const e of client.events(jobId)) events.push(e);
  return events;
}

describe("retries", () => {
  test("a failed attempt is retried and the job succeeds; each attempt shows, with the reason of the last", async () => {
    await agent("flaky", 'test "$BOXCAR_ATTEMPT" -ge 2 || { echo "attempt $BOXCAR_ATTEMPT fails" >&2; exit 3; }', { maxAttempts: 3 });
    const { job } = await client.submit({ agent: "flaky" });
    const final = await client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 2 });
    expect(final.history).toEqual([
      expect.objectContaining({ attempt: 1, state: "failed", error: expect.objectContaining({ code: ErrorCode.agentFailed }) }),
    ]);
    const types = (await jobEvents(job.id)).filter((e) => e.kind === "job").map((e) => `${e.type}:${e.attempt}`);
    expect(types).toEqual(["accepted:0", "queued:0", "started:1", "retrying:1", "started:2", "succeeded:2"]);
    const retrying = (await jobEvents(job.id)).find((e) => e.kind === "job" && e.type === "retrying");
    expect(retrying).toMatchObject({
      state: "queued",
      message: expect.stringContaining("attempt 1 of 3 failed (agent exited with code 3); retrying in 100 ms"),
    });
  });

  test("a timed-out attempt is retried when the policy says so", async () => {
    await agent("slowfirst", 'test "$BOXCAR_ATTEMPT" -ge 2 || sleep 30', { maxAttempts: 2, on: ["timeout"] }, "500ms");
    const { job } = await client.submit({ agent: "slowfirst" });
    const final = await client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 2, history: [expect.objectContaining({ state: "timed_out" })] });
  });

  test("an agent that says `retry: false` is not retried", async () => {
    await agent("hopeless", `echo '{"error":"the input is wrong","retry":false}' > "$BOXCAR_RESULT_FILE"`, { maxAttempts: 5 });
    const { job } = await client.submit({ agent: "hopeless" });
    const final = await client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "failed", attempt: 1, history: [] });
  });

  test("exhausted attempts end the job dead, kept in the dead-letter stream; `boxcar retry` runs it again", async () => {
    await agent("stubborn", 'test "$BOXCAR_ATTEMPT" -ge 3 || exit 1', { maxAttempts: 2 });
    const { job } = await client.submit({ agent: "stubborn" });
    const dead = await client.waitForJob(job.id);
    expect(dead).toMatchObject({ state: "dead", attempt: 2 });
    expect(dead.history.map((h) => h.attempt)).toEqual([1, 2]);

    const { names } = nats.topology;
    // The worker files the dead record right after writing it: wait for it to be stored.
    const kept = await eventually(async () => {
      const records = [];
      for await (const msg of readStream(nats.topology, names.streams.dead, names.subjects.dead("stubborn")))
        records.push(JobRecord.parse(msg.json()));
      return records.length > 0 ? records : undefined;
    }, "the dead-letter record");
    expect(kept.map((r) => [r.id, r.state])).toEqual([[job.id, "dead"]]);

    const cli = (...args: string[]) => boxcar(nats.url, names.prefix, args);
    expect((await cli("jobs", "--state", "dead")).stdout).toContain(job.id);
    const retried = await cli("retry", job.id);
    expect(retried.code).toBe(0);
    expect(retried.stdout).toContain(`${job.id} queued again`);
    const final = await client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 3 });
    expect(final.history.map((h) => h.attempt)).toEqual([1, 2]);
  });
});

describe("hand-backs and the retry budget", () => {
  test("an attempt handed back by a draining worker does not use up the job's attempts", async () => {
    // Attempt 1 runs long and is handed back; attempt 2 fails; attempt 3, the second real one, succeeds.
    await using drained = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()], pools: ["handback"] });
    await client.applyAgent({
      name: "handed",
      command: ["sh", "-c", 'case "$BOXCAR_ATTEMPT" in 1) sleep 30;; 2) exit 4;; esac'],
      trusted: true,
      pool: "handback",
      runtime: { sandbox: "host" },
      retry: { maxAttempts: 2, delay: "100ms", jitter: false },
    });
    void drained.run();
    const { job } = await client.submit({ agent: "handed" });
    await eventually(async () => ((await client.getJob(job.id)).state === "running" ? true : undefined), "attempt 1 to run");
    await drained.drain(100);
    expect(await client.getJob(job.id)).toMatchObject({ state: "queued", attempt: 1, attemptsAllowed: 3 });

    await using next = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()], pools: ["handback"] });
    void next.run();
    const final = await client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 3 });
    expect(final.history.map((h) => `${h.attempt}:${h.state}`)).toEqual(["2:failed"]);
  });
});

describe("an overall deadline across attempts", () => {
  test("no attempt is retried past the job's deadline: it ends with the reason", async () => {
    // Attempt 2 starts about 1 s in, with half a second to spare before the deadline (a busy CI
    // machine once took longer than the 150 ms a 400 ms delay left, and the job timed out waiting);
    // after it, another attempt could not start in time.
    await agent("never", "exit 2", { maxAttempts: 20, backoff: "fixed", delay: "1s" });
    const { job } = await client.submit({ agent: "never", deadline: "1500ms" });
    const final = await client.waitForJob(job.id);
    expect(final.state).toBe("failed");
    expect(final.attempt).toBeGreaterThan(1);
    expect(final.attempt).toBeLessThan(20);
    const last = (await jobEvents(job.id)).filter((e) => e.kind === "job").at(-1);
    expect(last).toMatchObject({
      type: "failed",
      message: "agent exited with code 2; not retried: the job's deadline comes before another attempt could start",
    });
  });

  test("an attempt still running at the deadline is stopped, and not retried", async () => {
    await agent("dawdler", "sleep 30", { maxAttempts: 3, on: ["timeout"] }, "60s");
    const { job } = await client.submit({ agent: "dawdler", deadline: "1s" });
    const final = await client.waitForJob(job.id);
    expect(final).toMatchObject({
      state: "timed_out",
      attempt: 1,
      error: { code: ErrorCode.timedOut, message: expect.stringMatching(/^the job passed its deadline of .* and was stopped$/) },
    });
  });

  test("a bad deadline is refused with the field named", async () => {
    await expect(client.submit({ agent: "dawdler", deadline: "-5s" })).rejects.toMatchObject({
      code: ErrorCode.invalid,
      issues: [expect.objectContaining({ path: "deadline" })],
    });
  });
});

describe("bad retry input gets a clear error", () => {
  test.each([
    ["negative attempts", { maxAttempts: -1 }, "retry.maxAttempts"],
    ["absurd delay", { delay: "100h" }, "retry.delay"],
    ["unknown failure kind", { on: ["always"] }, "retry.on[0]"],
  ])("%s", async (_what, retry, path) => {
    const err = await client.applyAgent({ name: "bad-retry", command: "true", retry }).catch((e: unknown) => e);
    // Relative to the request body, { definition }.
    expect(err).toMatchObject({ code: ErrorCode.invalid, issues: [expect.objectContaining({ path: `definition.${path}` })] });
  });

  test("retrying a job that succeeded, or an unknown one, is refused", async () => {
    await agent("fine", "true", { maxAttempts: 2 });
    const { job } = await client.submit({ agent: "fine" });
    await client.waitForJob(job.id);
    await expect(client.retryJob(job.id)).rejects.toMatchObject({
      code: ErrorCode.conflict,
      message: expect.stringContaining("only a dead, failed, timed-out or cancelled job can be retried (re-run it instead"),
    });
    await expect(client.retryJob("no-such-job")).rejects.toMatchObject({ code: ErrorCode.notFound });
  });
});
