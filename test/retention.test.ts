import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import { eventually, type NatsFixture, natsFixture, scratch } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker, type Worker } from "@boxcar/worker";
import { afterAll, beforeAll, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

let nats: NatsFixture;
let dispatcher: Dispatcher;
let worker: Worker;
let client: BoxcarClient;
let dir: Awaited<ReturnType<typeof scratch>>;

beforeAll(async () => {
  nats = await natsFixture();
  dir = await scratch("boxcar-retention-");
  // The dispatcher runs as its own role, with its own NATS permissions: the deletions must pass them.
  dispatcher = await startDispatcher({ ...nats.dispatcherRole, retentionIntervalMs: 250 });
  worker = createWorker({ ...nats.workerRole, concurrency: 4, providers: [createHostSandboxProvider()] });
  void worker.run();
  client = createClient(nats.topology);
  const script = (body: string) => ["sh", "-c", body];
  const host = { trusted: true, runtime: { sandbox: "host" } } as const;
  // Reads its input file, prints, writes an artifact.
  await client.applyAgent({
    name: "maker",
    command: script('cat data.txt; mkdir -p out; echo made > out/made.txt; printf \'{"output":"ok"}\' > "$BOXCAR_RESULT_FILE"'),
    outputs: ["out/**"],
    ...host,
  });
  await client.applyAgent({ name: "slow", command: script('sleep 4; printf \'{"output":null}\' > "$BOXCAR_RESULT_FILE"'), ...host });
  await client.applyAgent({ name: "waiter", command: script("sleep 60"), ...host });
  await client.applyAgent({ name: "broken", command: script("echo failing; exit 3"), ...host });
  await client.setPolicy({ retention: { jobs: "2s", failed: "1h" } });
}, 60_000);
afterAll(async () => {
  await worker?.close();
  await dispatcher?.close();
  await dir?.[Symbol.asyncDispose]();
  await nats?.[Symbol.asyncDispose]();
});

/** Every message the job has left in the events and logs streams and in the jobs bucket's stream. */
async function leftOf(jobId: string, owner = "local"): Promise<Record<string, number>> {
  const { jsm, names } = nats.topology;
  const count = async (stream: string, subject: string) =>
    Object.values((await jsm.streams.info(stream, { subjects_filter: subject })).state.subjects ?? {}).reduce((a, b) => a + b, 0);
  return {
    events: await count(names.streams.events, names.subjects.jobEvents(owner, jobId)),
    logs: await count(names.streams.logs, names.subjects.jobLogs(owner, jobId)),
    record: await count(`KV_${names.buckets.jobs}`, `$KV.${names.buckets.jobs}.${jobId}`),
  };
}

/** What the Object Store holds of an object: its name (not deleted), its metadata messages and its chunks. */
async function stored(object: { name: string; nuid: string }): Promise<{ live: boolean; meta: number; chunks: number }> {
  const { artifacts, jsm, names } = nats.topology;
  const info = await artifacts.info(object.name);
  const bucket = names.buckets.artifacts;
  const count = async (subject: string) =>
    Object.values((await jsm.streams.info(`OBJ_${bucket}`, { subjects_filter: subject })).state.subjects ?? {}).reduce((a, b) => a + b, 0);
  const encoded = Buffer.from(object.name).toString("base64").replaceAll("+", "-").replaceAll("/", "_");
  return {
    live: info !== null && !info.deleted,
    meta: await count(`$O.${bucket}.M.${encoded}`),
    chunks: await count(`$O.${bucket}.C.${object.nuid}`),
  };
}

/** The object's name and chunk id, read while it exists. */
async function objectRef(name: string): Promise<{ name: string; nuid: string }> {
  const info = await nats.topology.artifacts.info(name);
  if (!info) throw new Error(`no object ${name}`);
  return { name, nuid: info.nuid };
}

const GONE = { live: false, meta: 0, chunks: 0 };

test("an ended job past its retention is deleted with its events, output, input files and artifacts; a failed one is kept longer; the system runs on", async () => {
  const file = join(dir.path, "data.txt");
  await writeFile(file, "the input\n");
  const { job: made } = await client.submit({ agent: "maker" }, { upload: [{ localPath: file, path: "data.txt" }] });
  const { job: failed } = await client.submit({ agent: "broken" });
  const done = await client.waitForJob(made.id);
  expect(done.state).toBe("succeeded");
  expect((await client.waitForJob(failed.id)).state).toBe("failed");
  const input = await objectRef(done.spec?.files[0]?.object ?? "");
  const artifact = await objectRef(done.artifacts[0]?.object ?? "");
  expect(await stored(input)).toEqual({ live: true, meta: 1, chunks: 1 });
  expect(await stored(artifact)).toEqual({ live: true, meta: 1, chunks: 1 });
  const before = await leftOf(made.id);
  expect(before.events).toBeGreaterThan(0);
  expect(before.logs).toBeGreaterThan(0);
  expect(before.record).toBeGreaterThan(0);

  // Two seconds after it ended, and a sweep: nothing of it is left but its record's delete marker,
  // which a sweep purges 30 s later (once every dispatcher's watch has shown it).
  await eventually(
    async () => ((await client.getJob(made.id).catch((e: { code?: string }) => e.code)) === "not_found" ? true : undefined),
    "the job to be deleted",
  );
  expect(await leftOf(made.id)).toEqual({ events: 0, logs: 0, record: 1 });
  expect(await stored(input)).toEqual(GONE);
  expect(await stored(artifact)).toEqual(GONE);
  // A failed job is kept for the longer `failed` retention.
  expect((await client.getJob(failed.id)).state).toBe("failed");
  expect((await leftOf(failed.id)).events).toBeGreaterThan(0);

  // The system runs on.
  const { job: next } = await client.submit({ agent: "slow" });
  expect((await client.waitForJob(next.id)).state).toBe("succeeded");
}, 60_000);

test("an input file that a job still running also names keeps the ended job that named it until that one ends too (here, cancelled)", async () => {
  const file = join(dir.path, "shared.txt");
  await writeFile(file, "shared\n");
  const ref = await client.uploadInput(file, "data.txt");
  const shared = await objectRef(ref.object);
  const { job: slow } = await client.submit({ agent: "waiter", files: [ref] });
  await eventually(async () => ((await client.getJob(slow.id)).state === "running" ? true : undefined), "the waiting job to run");
  const { job: quick } = await client.submit({ agent: "maker", files: [ref] });
  expect((await client.waitForJob(quick.id)).state).toBe("succeeded");
  // Past the quick job's retention while the other one still runs: kept, and so is the file.
  await sleep(2_500);
  expect((await client.getJob(quick.id)).state).toBe("succeeded");
  expect((await stored(shared)).live).toBe(true);

  await client.cancelJob(slow.id);
  expect((await client.waitForJob(slow.id)).state).toBe("cancelled");
  await eventually(async () => {
    const gone = await Promise.all(
      [quick.id, slow.id].map(async (id) => (await client.getJob(id).catch((e: { code?: string }) => e.code)) === "not_found"),
    );
    return gone.every(Boolean) ? true : undefined;
  }, "both jobs to be deleted");
  expect(await stored(shared)).toEqual(GONE);
}, 60_000);

test("an agent's own retention replaces the system's for its jobs; an ended workflow run goes, with its events, after the system's", async () => {
  await client.applyAgent({ name: "keeper", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
  await client.setPolicy({ retention: { jobs: "2s", failed: "1h", agents: { keeper: { jobs: "1h" }, broken: { failed: "2s" } } } });
  const { job: kept } = await client.submit({ agent: "keeper" });
  const { job: dropped } = await client.submit({ agent: "broken" });
  const { run } = await client.startRun({ workflow: { name: "kept-step", steps: [{ name: "keep", agent: "keeper" }] } });
  expect((await client.waitForRun(run.id)).state).toBe("succeeded");
  expect((await client.waitForJob(kept.id)).state).toBe("succeeded");
  expect((await client.waitForJob(dropped.id)).state).toBe("failed");
  const { jsm, names } = nats.topology;
  const count = async (stream: string, subject: string) =>
    Object.values((await jsm.streams.info(stream, { subjects_filter: subject })).state.subjects ?? {}).reduce((a, b) => a + b, 0);
  const runLeft = async () => ({
    events: await count(names.streams.events, names.subjects.runEvents("local", run.id)),
    record: await count(`KV_${names.buckets.workflows}`, `$KV.${names.buckets.workflows}.${run.id}`),
  });
  expect((await runLeft()).events).toBeGreaterThan(0);

  // The failed job goes after its agent's 2 s (the system keeps failed jobs an hour); the run
  // after the system's 2 s, though its step's job is kept an hour by its agent's.
  const gone = async (read: () => Promise<unknown>) =>
    (await read().then(
      () => "there",
      (e: { code?: string }) => e.code,
    )) === "not_found";
  await eventually(
    async () => ((await gone(() => client.getJob(dropped.id))) && (await gone(() => client.getRun(run.id))) ? true : undefined),
    "the failed job and the run to be deleted",
  );
  // Each record's delete marker is left, for a later sweep to purge.
  expect(await leftOf(dropped.id)).toEqual({ events: 0, logs: 0, record: 1 });
  expect(await runLeft()).toEqual({ events: 0, record: 1 });
  expect((await client.getJob(kept.id)).state).toBe("succeeded");
  const stepJob = (await client.listJobs({ agent: "keeper", limit: 100 })).jobs.find((j) => j.chain?.run === run.id);
  expect(stepJob?.state).toBe("succeeded");
}, 60_000);

test("boxcar clean deletes now the ended jobs that match, as an admin asks; a submitter may not; bad flags are usage errors", async () => {
  await client.setPolicy({ retention: { jobs: "1h" } });
  const ids = async (agent: string) => {
    const { job } = await client.submit({ agent });
    await client.waitForJob(job.id);
    return job.id;
  };
  const made = [await ids("maker"), await ids("maker")];
  const broken = await ids("broken");
  const prefix = nats.topology.names.prefix;
  const gone = async (id: string) => (await client.getJob(id).catch((e: { code?: string }) => e.code)) === "not_found";

  const usage = await boxcar(nats.url, prefix, ["clean", "--older-than", "soon"]);
  expect(usage).toMatchObject({ code: 2, stderr: expect.stringContaining("--older-than must be a duration") });
  const running = await boxcar(nats.url, prefix, ["clean", "--older-than", "0s", "--state", "running"]);
  expect(running).toMatchObject({ code: 2, stderr: expect.stringContaining("--state must be a final state") });
  const missing = await boxcar(nats.url, prefix, ["clean"]);
  expect(missing).toMatchObject({ code: 2, stderr: expect.stringContaining("give --older-than") });

  // Ended an hour ago or more: none of these.
  const none = await boxcar(nats.url, prefix, ["clean", "--older-than", "1h"]);
  expect(none).toMatchObject({ code: 0, stdout: expect.stringContaining("deleted 0 ended jobs") });
  await nats.auth.mint("carol", "submitter");
  const asSubmitter = await boxcar(nats.url, prefix, ["clean", "--older-than", "0s"], { NATS_CREDS: nats.auth.credsFile("carol") });
  expect(asSubmitter.code).toBe(3);
  expect(asSubmitter.stderr).toContain("forbidden");
  expect(await gone(made[0] as string)).toBe(false);

  const cleaned = await boxcar(nats.url, prefix, ["clean", "--older-than", "0s", "--state", "succeeded", "--agent", "maker"]);
  expect(cleaned.code, cleaned.stderr).toBe(0);
  expect(cleaned.stdout).toContain("deleted 2 ended jobs");
  for (const id of made) {
    expect(await gone(id)).toBe(true);
    expect(await leftOf(id)).toEqual({ events: 0, logs: 0, record: 1 }); // its delete marker
  }
  expect((await client.getJob(broken)).state).toBe("failed");
}, 60_000);

test("the dispatcher's credential may remove a record's revision by its sequence, as retention does; a worker's may not", async () => {
  const stream = `KV_${nats.topology.names.buckets.jobs}`;
  const seq = await nats.topology.jobs.put("by-sequence", "{}");
  // A worker may write job records, but never remove one: the bucket is the jobs' history.
  await expect(nats.workerRole.topology.jsm.streams.deleteMessage(stream, seq, false)).rejects.toThrow(/Permissions Violation/);
  expect((await nats.topology.jobs.get("by-sequence"))?.operation).toBe("PUT");
  expect(await nats.dispatcherRole.topology.jsm.streams.deleteMessage(stream, seq, false)).toBe(true);
  expect(await nats.topology.jobs.get("by-sequence")).toBeNull();
});
