/**
 * Signals to running jobs (issue 21, part 4): a signal (a name and a JSON payload) reaches the
 * running agent as a file in its workspace, plus an event; against a real nats-server, a
 * dispatcher and a host worker, with a principal per user.
 */

import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode } from "@boxcar/protocol";
import { eventually, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";
import { securedSystem } from "./helpers/secured.js";

test("a signal reaches the running agent as a file and an event; one to a job not running, another user's, or too large is refused", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  const bob = await system.as("bob");
  await admin.client.applyAgent({
    name: "listener",
    // Waits (up to 20 s) for two signals, and returns them in the order they came.
    command: `for i in $(seq 200); do n=$(ls "$BOXCAR_SIGNALS_DIR" 2>/dev/null | wc -l); [ "$n" -ge 2 ] && break; sleep 0.1; done
      cd "$BOXCAR_SIGNALS_DIR" && printf '{"output":[%s,%s]}' "$(cat $(ls | head -1))" "$(cat $(ls | tail -1))" > "$BOXCAR_RESULT_FILE"`,
    trusted: true,
    runtime: { sandbox: "host" },
  });
  await admin.client.applyAgent({ name: "idle", command: "true", trusted: true, runtime: { sandbox: "host" }, pool: "nobody" });

  const { job } = await alice.client.submit({ agent: "listener" });
  await eventually(async () => ((await alice.client.getJob(job.id)).state === "running" ? true : undefined), "the job to run");
  const first = await alice.client.signalJob(job.id, "approve", { by: "alice", n: 1 });
  expect(first.file).toBe(".boxcar/signals/0001-approve.json");
  // From the command line too.
  const cli = await boxcar(system.url, system.prefix, ["signal", job.id, "stop", "--payload", '{"why":"enough"}'], {
    NATS_CREDS: alice.creds,
  });
  expect(cli.stdout).toContain(`${job.id}: signal stop written to .boxcar/signals/0002-stop.json`);

  const done = await admin.client.waitForJob(job.id);
  expect(done.state).toBe("succeeded");
  expect(done.result?.output).toEqual([
    { name: "approve", payload: { by: "alice", n: 1 }, at: expect.any(String) },
    { name: "stop", payload: { why: "enough" }, at: expect.any(String) },
  ]);
  const signals: string[] = [];
  for await (const e of alice.client.events(job.id)) if (e.kind === "job" && e.type === "signal") signals.push(e.message ?? "");
  expect(signals).toEqual(["signal approve in .boxcar/signals/0001-approve.json", "signal stop in .boxcar/signals/0002-stop.json"]);

  // Refusals: a job that ended, another user's, a payload too large, a bad name. One not started
  // keeps it.
  await expect(alice.client.signalJob(job.id, "late")).rejects.toMatchObject({
    code: ErrorCode.conflict,
    message: expect.stringContaining("it is succeeded"),
  });
  const queued = (await alice.client.submit({ agent: "idle" })).job;
  expect(await alice.client.signalJob(queued.id, "go")).toMatchObject({ kept: true, file: ".boxcar/signals/0001-go.json" });
  await expect(bob.client.signalJob(queued.id, "go")).rejects.toMatchObject({ code: ErrorCode.notFound });
  await expect(alice.client.signalJob(queued.id, "go", "x".repeat(70_000))).rejects.toMatchObject({ code: ErrorCode.invalid });
  await expect(alice.client.signalJob(queued.id, "no/slash")).rejects.toMatchObject({ code: ErrorCode.invalid });
  await alice.client.cancelJob(queued.id);
  await expect(alice.client.signalJob(queued.id, "go")).rejects.toMatchObject({ code: ErrorCode.conflict });

  // Signals to a job not yet started wait for it: its agent finds them when it starts, in order.
  const later = (await alice.client.submit({ agent: "listener", delay: "3s" })).job;
  const kept = await boxcar(system.url, system.prefix, ["signal", later.id, "first", "--payload", "1"], { NATS_CREDS: alice.creds });
  expect(kept.stdout).toContain(`${later.id}: signal first kept until it starts, for .boxcar/signals/0001-first.json`);
  expect(await alice.client.signalJob(later.id, "second", 2)).toMatchObject({ kept: true, file: ".boxcar/signals/0002-second.json" });
  expect((await alice.client.getJob(later.id)).state).toBe("queued");
  const status = await boxcar(system.url, system.prefix, ["status", later.id], { NATS_CREDS: alice.creds });
  expect(status.stdout).toContain("signals   first, second (sent before it started");
  const started = await admin.client.waitForJob(later.id);
  expect(started.result?.output).toEqual([
    { name: "first", payload: 1, at: expect.any(String) },
    { name: "second", payload: 2, at: expect.any(String) },
  ]);

  // To a workflow run: each of its jobs running gets it.
  const { run } = await alice.client.startRun({
    workflow: {
      name: "two",
      steps: [
        { name: "a", agent: "listener" },
        { name: "b", agent: "listener" },
      ],
    },
  });
  await eventually(async () => {
    const r = await alice.client.getRun(run.id);
    const jobs = Object.values(r.steps).flatMap((s) => s.instances.flatMap((i) => i.jobs));
    const states = await Promise.all(jobs.map(async (id) => (await alice.client.getJob(id)).state));
    return states.length === 2 && states.every((s) => s === "running") ? true : undefined;
  }, "both steps' jobs to run");
  const toRun = await alice.client.signalRun(run.id, "go", 1);
  expect(toRun.delivered.map((d) => d.file)).toEqual([".boxcar/signals/0001-go.json", ".boxcar/signals/0001-go.json"]);
  expect(toRun.missed).toEqual([]);
  const viaCli = await boxcar(system.url, system.prefix, ["workflow", "signal", run.id, "go", "--payload", "2"], {
    NATS_CREDS: alice.creds,
  });
  expect(viaCli.stdout.match(/signal go written to \.boxcar\/signals\/0002-go\.json/g)).toHaveLength(2);
  const ended = await admin.client.waitForRun(run.id);
  expect(ended.state).toBe("succeeded");
  await expect(alice.client.signalRun(run.id, "late")).rejects.toMatchObject({ code: ErrorCode.conflict });
  await expect(bob.client.signalRun(run.id, "go")).rejects.toMatchObject({ code: ErrorCode.notFound });
});

test("workers sharing one connection (as boxcar up runs them) on a server with authentication: the one running the job answers its signal", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  // Each worker once subscribed on its own: the server then delivered the request once per
  // subscription to the one connection, and let it answer none of them.
  const workers = [0, 1].map(() => createWorker({ ...nats.workerRole, concurrency: 1, providers: [createHostSandboxProvider()] }));
  for (const w of workers) void w.run();
  try {
    const client = createClient(nats.topology);
    await client.applyAgent({ name: "waiter", command: "sleep 2", trusted: true, runtime: { sandbox: "host" } });
    const jobs = [(await client.submit({ agent: "waiter" })).job, (await client.submit({ agent: "waiter" })).job];
    for (const job of jobs) {
      await eventually(async () => ((await client.getJob(job.id)).state === "running" ? true : undefined), "the job to run");
      expect((await client.signalJob(job.id, "go")).file).toBe(".boxcar/signals/0001-go.json");
    }
    // One worker stopped, the other still takes its signals.
    await workers[0]?.close();
    const last = (await client.submit({ agent: "waiter" })).job;
    await eventually(async () => ((await client.getJob(last.id)).state === "running" ? true : undefined), "the last job to run");
    expect((await client.signalJob(last.id, "go")).file).toBe(".boxcar/signals/0001-go.json");
  } finally {
    for (const w of workers) await w.close();
  }
}, 30_000);

test("a signal kept for a job before it started reaches each of its attempts", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  await using worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  await client.applyAgent({
    name: "twice",
    // The first attempt fails once it has looked; the second returns what it found.
    command: `[ "$BOXCAR_ATTEMPT" = 1 ] && { ls "$BOXCAR_SIGNALS_DIR"; exit 1; }; printf '{"output":"%s"}' "$(ls "$BOXCAR_SIGNALS_DIR")" > "$BOXCAR_RESULT_FILE"`,
    trusted: true,
    runtime: { sandbox: "host" },
    retry: { maxAttempts: 2, delay: 0, backoff: "fixed", jitter: false },
  });
  const { job } = await client.submit({ agent: "twice", delay: "2s" });
  expect(await client.signalJob(job.id, "go")).toMatchObject({ kept: true });
  const done = await client.waitForJob(job.id);
  expect(done).toMatchObject({ state: "succeeded", attempt: 2, result: { output: "0001-go.json" } });
  let firstSaw = "";
  for await (const chunk of client.logs(job.id)) firstSaw += new TextDecoder().decode(chunk.data);
  expect(firstSaw).toContain("0001-go.json");
});

test("a job not started keeps at most 16 signals and 64 KiB of payload, in its record; past that the signal is refused and nothing is kept", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent({ name: "unserved", command: "true", trusted: true, runtime: { sandbox: "host" }, pool: "nobody" });
  const many = (await client.submit({ agent: "unserved" })).job;
  for (let i = 1; i <= 16; i++)
    expect((await client.signalJob(many.id, `s${i}`, i)).file).toBe(`.boxcar/signals/${String(i).padStart(4, "0")}-s${i}.json`);
  await expect(client.signalJob(many.id, "s17")).rejects.toMatchObject({
    code: ErrorCode.conflict,
    message: expect.stringContaining("at most 16"),
  });
  expect((await client.getJob(many.id)).signals?.map((s) => s.payload)).toEqual(Array.from({ length: 16 }, (_, i) => i + 1));

  const big = (await client.submit({ agent: "unserved" })).job;
  await client.signalJob(big.id, "a", "x".repeat(60_000));
  await expect(client.signalJob(big.id, "b", "y".repeat(10_000))).rejects.toMatchObject({ code: ErrorCode.conflict });
  expect((await client.getJob(big.id)).signals?.map((s) => s.name)).toEqual(["a"]);
});
