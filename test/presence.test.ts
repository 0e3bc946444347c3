import type { BoxcarClient } from "@boxcar/client";
import { MISSED_HEARTBEATS, TERMINAL_STATES, WorkerInfo, type WorkerView, workerStatus } from "@boxcar/protocol";
import { eventually, localSystem, type NatsFixture, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker, type SandboxProvider } from "@boxcar/worker";
import { expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { leasedSystem } from "./helpers/leased.js";

/** Workers heartbeat every 300 ms here, so one silent for 900 ms is gone. */
const HEARTBEAT_MS = 300;
const GONE_AFTER_MS = MISSED_HEARTBEATS * HEARTBEAT_MS;
/** Slack on top of the bound: each look is a fresh `boxcar workers` process on a busy machine. */
const SLACK_MS = 10_000;
/** A short lease, so a killed worker's job is delivered again soon. */
const LEASE_MS = 1_500;

const system = () => leasedSystem(LEASE_MS);

function spawnWorker(nats: NatsFixture, ...flags: string[]) {
  return spawnBoxcar(nats.url, nats.topology.names.prefix, ["worker", "--heartbeat", `${HEARTBEAT_MS}ms`, ...flags]);
}

/** `boxcar workers --json`, as an operator would run it. */
async function workersCli(nats: NatsFixture): Promise<WorkerView[]> {
  const result = await boxcar(nats.url, nats.topology.names.prefix, ["workers", "--json"]);
  expect(result.stderr).toBe("");
  expect(result.code).toBe(0);
  return JSON.parse(result.stdout) as WorkerView[];
}

async function runningOn(client: BoxcarClient, jobId: string): Promise<string | undefined> {
  const job = await client.getJob(jobId);
  return job.state === "running" ? job.workerId : undefined;
}

async function finalEvents(client: BoxcarClient, jobId: string): Promise<string[]> {
  const types: string[] = [];
  for await (const e of client.events(jobId)) if (e.kind === "job" && TERMINAL_STATES.has(e.state)) types.push(`${e.type}:${e.attempt}`);
  return types;
}

test("a worker SIGKILLed mid-job is gone within 3 missed heartbeats, its job listed and accounted for; the other stays live", async () => {
  await using s = await system();
  await s.client.applyAgent({
    name: "crashy",
    command: 'if [ "$BOXCAR_ATTEMPT" = 1 ]; then sleep 300; fi; echo "attempt $BOXCAR_ATTEMPT done"',
    trusted: true,
    runtime: { sandbox: "host" },
  });
  const doomed = spawnWorker(s.nats);
  let survivor: ReturnType<typeof spawnWorker> | undefined;
  try {
    const { job } = await s.client.submit({ agent: "crashy" });
    const doomedId = await eventually(() => runningOn(s.client, job.id), "attempt 1 to run");
    survivor = spawnWorker(s.nats);
    const survivorPid = survivor.pid;
    const before = await eventually(async () => {
      const list = await workersCli(s.nats);
      return list.length === 2 && list.every((w) => w.status === "live") ? list : undefined;
    }, "both workers to show live");
    const survivorId = before.find((w) => w.pid === survivorPid)?.id as string;
    expect(before.find((w) => w.id === doomedId)).toMatchObject({ load: 1, jobs: [job.id], goneAfterMs: GONE_AFTER_MS });

    doomed.kill("SIGKILL");
    await exited(doomed);
    const killedAt = Date.now();
    const gone = await eventually(
      async () => {
        const list = await workersCli(s.nats);
        return list.find((w) => w.id === doomedId)?.status === "gone" ? list : undefined;
      },
      "the killed worker to show gone",
      GONE_AFTER_MS + SLACK_MS,
    );
    process.stdout.write(`presence: SIGKILLed worker seen gone after ${Date.now() - killedAt} ms (bound ${GONE_AFTER_MS} ms)\n`);
    expect(gone.find((w) => w.id === survivorId)?.status).toBe("live");
    const ghost = gone.find((w) => w.id === doomedId);
    expect(ghost).toMatchObject({ jobs: [job.id], load: 1 });
    expect(ghost?.heartbeatAgeMs).toBeGreaterThan(GONE_AFTER_MS);
    expect(ghost?.inFlight).toEqual([expect.objectContaining({ jobId: job.id, fate: expect.any(String), summary: expect.any(String) })]);

    // The lease runs out, the survivor runs attempt 2, and the gone worker's entry says so.
    const final = await s.client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 2, workerId: survivorId });
    expect(await finalEvents(s.client, job.id)).toEqual(["succeeded:2"]);
    const after = (await workersCli(s.nats)).find((w) => w.id === doomedId);
    expect(after?.inFlight).toEqual([
      {
        jobId: job.id,
        fate: "finished",
        state: "succeeded",
        attempt: 2,
        workerId: survivorId,
        summary: `succeeded on ${survivorId} as attempt 2`,
      },
    ]);
    const text = await boxcar(s.nats.url, s.nats.topology.names.prefix, ["workers"]);
    expect(text.code).toBe(0);
    expect(text.stdout).toMatch(new RegExp(`^${survivorId} +live .* 0/4 `, "m"));
    expect(text.stdout).toMatch(new RegExp(`^${doomedId} +gone .* 1/4 `, "m"));
    expect(text.stdout).toContain(`${doomedId} is gone`);
    expect(text.stdout).toContain(`  ${job.id}  succeeded on ${survivorId} as attempt 2`);
    const onlyGone = await boxcar(s.nats.url, s.nats.topology.names.prefix, ["workers", "--status", "gone", "--json"]);
    expect((JSON.parse(onlyGone.stdout) as WorkerView[]).map((w) => w.id)).toEqual([doomedId]);
  } finally {
    doomed.kill("SIGKILL");
    survivor?.kill("SIGTERM");
    if (survivor) await exited(survivor);
  }
});

test("a worker sent SIGTERM with a long job shows draining while it finishes the job, never gone, then disappears", async () => {
  await using s = await system();
  await s.client.applyAgent({ name: "long", command: "sleep 4; echo done", trusted: true, runtime: { sandbox: "host" } });
  const child = spawnWorker(s.nats, "--drain-grace", "30s");
  try {
    const { job } = await s.client.submit({ agent: "long" });
    const workerId = await eventually(() => runningOn(s.client, job.id), "the job to run");
    child.kill("SIGTERM");
    const exit = exited(child);
    let stopped = false;
    void exit.then(() => {
      stopped = true;
    });

    // Look while it drains: it keeps heartbeating, so it is draining with its job, and never gone.
    const seen: string[] = [];
    while (!stopped) {
      const me = (await workersCli(s.nats)).find((w) => w.id === workerId);
      seen.push(me?.status ?? "absent");
      if (me?.status === "draining") expect(me).toMatchObject({ load: 1, jobs: [job.id] });
    }
    expect(await exit).toEqual({ code: 0, signal: null });
    // live (until the signal lands), draining, then absent once its entry is removed.
    expect(`${seen.join(" ")} `).toMatch(/^(live )*(draining )+(absent )*$/);

    expect((await workersCli(s.nats)).find((w) => w.id === workerId)).toBeUndefined();
    expect(await s.client.getJob(job.id)).toMatchObject({ state: "succeeded", attempt: 1 });
    expect(await finalEvents(s.client, job.id)).toEqual(["succeeded:1"]);
  } finally {
    child.kill("SIGKILL");
  }
});

test("a worker whose sandbox probe stops answering keeps heartbeating: it stays live", async () => {
  await using nats = await natsFixture();
  let probes = 0;
  // A Docker engine that answers the first ping, then hangs on every later one.
  const stuckDocker: SandboxProvider = {
    kind: "docker",
    available: () => (probes++ === 0 ? Promise.resolve(false) : new Promise<boolean>(() => {})),
    create: () => Promise.reject(new Error("not used")),
  };
  await using worker = createWorker({
    ...nats.workerRole,
    providers: [createHostSandboxProvider(), stuckDocker],
    heartbeatMs: HEARTBEAT_MS,
  });
  void worker.run();
  const presence = async () => {
    const entry = await nats.topology.workers.get(worker.id);
    return entry?.operation === "PUT" ? WorkerInfo.parse(entry.json()) : undefined;
  };
  const first = await eventually(presence, "the worker's presence");
  // Several bounds' worth of heartbeats while the probe hangs: every look finds it live.
  for (let i = 0; i < 15; i++) {
    await new Promise((r) => setTimeout(r, HEARTBEAT_MS));
    const now = await presence();
    expect(now && workerStatus(now)).toBe("live");
  }
  expect(probes).toBeGreaterThan(1);
  expect(Date.parse((await presence())?.heartbeatAt ?? "")).toBeGreaterThan(Date.parse(first.heartbeatAt));
});

test("an idle worker writes its unchanged presence every idle heartbeat and says so; a job brings it back to its heartbeat at once", async () => {
  const heartbeatMs = 200;
  const idleHeartbeatMs = 1_200;
  await using system = await localSystem({ worker: { heartbeatMs, idleHeartbeatMs } });
  const { client, worker, nats } = system;
  const workerId = worker.id;
  await client.applyAgent({ name: "nap", command: ["sleep", "1.5"], trusted: true, runtime: { sandbox: "host", timeout: "30s" } });
  // Every write of the presence, as a reader of the bucket sees it.
  const writes: WorkerInfo[] = [];
  const watch = await nats.topology.workers.watch({ key: workerId });
  void (async () => {
    for await (const entry of watch) if (entry.operation === "PUT") writes.push(WorkerInfo.parse(entry.json()));
  })();
  try {
    // Idle: a write every 1.2 s (not every 0.2 s), each promising 1.2 s; live all along.
    await new Promise((r) => setTimeout(r, 4_000));
    const idle = writes.filter((w) => w.load === 0);
    expect(idle.length).toBeGreaterThanOrEqual(2);
    expect(idle.length).toBeLessThanOrEqual(6); // at the busy heartbeat it would be about 20
    expect(idle.every((w) => w.heartbeatMs === idleHeartbeatMs)).toBe(true);
    const last = writes.at(-1) as WorkerInfo;
    expect(workerStatus(last)).toBe("live");

    // A job: within a heartbeat the presence says so, promising the busy interval.
    const { job } = await client.submit({ agent: "nap", input: {} });
    const busy = await eventually(async () => writes.find((w) => w.jobs.includes(job.id)), "the presence names the job", 5_000);
    expect(busy.heartbeatMs).toBe(heartbeatMs);
    expect(busy.load).toBe(1);
    await client.waitForJob(job.id);
    // Idle again: it goes back to the idle interval.
    await eventually(
      async () => (writes.at(-1)?.load === 0 && writes.at(-1)?.heartbeatMs === idleHeartbeatMs ? true : undefined),
      "idle again",
      5_000,
    );
  } finally {
    watch.stop();
  }
}, 60_000);
