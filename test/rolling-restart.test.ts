import { type BoxcarClient, createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { type BoxcarEvent, TERMINAL_STATES, type WorkerInfo, workerStatus } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";

const JOBS = 60;
const WORKERS = 3;

/** A worker process as an operator would run it, with a drain grace short enough that some jobs are handed back. */
function spawnWorker(nats: NatsFixture) {
  return spawnBoxcar(nats.url, nats.topology.names.prefix, [
    "worker",
    "--concurrency",
    "2",
    "--sandboxes",
    "host",
    "--heartbeat",
    "300ms",
    "--drain-grace",
    "100ms",
  ]);
}
type WorkerProcess = ReturnType<typeof spawnWorker>;

/** The presence of the worker process `child`, once it is live. */
async function liveWorker(client: BoxcarClient, child: WorkerProcess): Promise<WorkerInfo> {
  return eventually(
    async () => (await client.listWorkers()).find((w) => w.pid === child.pid && workerStatus(w) === "live"),
    `worker process ${child.pid} to be live`,
  );
}

async function jobEvents(client: BoxcarClient, jobId: string): Promise<BoxcarEvent[]> {
  const events: BoxcarEvent[] = [];
  for await (const e of client.events(jobId)) events.push(e);
  return events;
}

test("a rolling restart of every worker (SIGTERM, short grace) loses no job and runs none to an outcome twice", async () => {
  await using nats = await natsFixture({ ackWaitMs: 5_000 });
  await nats.topology.ensurePoolConsumer("default");
  await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  const client = createClient(nats.topology);
  await client.applyAgent({
    name: "nap",
    // Sleeps the seconds its input names (0.2-0.8), then reports which attempt finished.
    command: `sleep "$(tr -cd '0-9.' < "$BOXCAR_INPUT_FILE")"; printf '{"output":{"attempt":%s}}' "$BOXCAR_ATTEMPT" > "$BOXCAR_RESULT_FILE"`,
    trusted: true,
    runtime: { sandbox: "host", timeout: "1m" },
  });

  const processes: WorkerProcess[] = [];
  const start = () => {
    const child = spawnWorker(nats);
    processes.push(child);
    return child;
  };
  try {
    let current = Array.from({ length: WORKERS }, start);
    const firstIds = (await Promise.all(current.map((c) => liveWorker(client, c)))).map((w) => w.id);

    const ids = await Promise.all(
      Array.from({ length: JOBS }, async (_, i) => (await client.submit({ agent: "nap", input: { s: 0.2 + (i % 7) * 0.1 } })).job.id),
    );

    // Replace each worker in turn: start the new one, wait until it is live, then SIGTERM the old one
    // once it holds work, and wait for it to exit.
    let restarts = 0;
    for (let i = 0; i < WORKERS; i++) {
      const old = current[i] as WorkerProcess;
      const replacement = start();
      await liveWorker(client, replacement);
      await eventually(async () => {
        const busy = (await client.listWorkers()).some((w) => w.pid === old.pid && w.load > 0);
        const finished = (await Promise.all(ids.map((id) => client.getJob(id)))).every((j) => TERMINAL_STATES.has(j.state));
        return busy || finished ? true : undefined;
      }, "the old worker to hold work");
      old.kill("SIGTERM");
      expect(await exited(old)).toEqual({ code: 0, signal: null });
      current = current.map((c, j) => (j === i ? replacement : c));
      restarts += 1;
    }

    const finals = await Promise.all(ids.map((id) => client.waitForJob(id)));
    let handedBack = 0;
    let rerun = 0;
    for (const [i, id] of ids.entries()) {
      const events = (await jobEvents(client, id)).filter((e) => e.kind === "job");
      const outcomes = events.filter((e) => TERMINAL_STATES.has(e.state)).map((e) => e.type);
      expect({ id, outcomes }).toEqual({ id, outcomes: ["succeeded"] });
      expect(finals[i]).toMatchObject({ state: "succeeded", result: { output: { attempt: finals[i]?.attempt } } });
      const requeued = events.filter((e) => e.type === "requeued").length;
      handedBack += requeued;
      if ((finals[i]?.attempt ?? 0) > 1) rerun += 1;
    }
    process.stdout.write(
      `rolling restart: ${JOBS} jobs, ${restarts} restarts, ${handedBack} handed back on drain, ${rerun} ran more than one attempt; all ${JOBS} succeeded once\n`,
    );
    expect(restarts).toBe(WORKERS);
    // The short grace did cut some jobs short: the hand-back path was exercised, not skipped.
    expect(handedBack).toBeGreaterThan(0);

    // Nothing is left behind: the work stream is empty, and only the replacements are listed, all live.
    await eventually(
      async () => ((await nats.topology.jsm.streams.info(nats.topology.names.streams.work)).state.messages === 0 ? true : undefined),
      "the work stream to be empty",
    );
    const listed = JSON.parse((await boxcar(nats.url, nats.topology.names.prefix, ["workers", "--json"])).stdout) as WorkerInfo[];
    const replacementPids = current.map((c) => c.pid);
    expect(listed.map((w) => [w.pid, workerStatus(w)]).sort()).toEqual(replacementPids.map((pid) => [pid, "live"]).sort());
    expect(listed.some((w) => firstIds.includes(w.id))).toBe(false);
  } finally {
    for (const child of processes) child.kill("SIGTERM");
    await Promise.all(processes.map((child) => exited(child)));
  }
});
