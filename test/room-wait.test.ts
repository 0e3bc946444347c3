/**
 * A worker waits for room instead of failing a job (issue 44's leftover): what an attempt must
 * store once its agent has ended (its artifacts, output, events and record) waits while
 * JetStream's store is full, its lease kept, then is stored once room frees; past the worker's
 * `roomWaitMs` the job fails `storage_full`, saying the store stayed full. Against a real
 * nats-server with a small store, filled to its last byte by a stream of the test's own.
 */

import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { createClient } from "@boxcar/client";
import type { Logger } from "@boxcar/common";
import { startDispatcher } from "@boxcar/dispatcher";
import type { BoxcarError } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture, scratch } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker, type WorkerOptions } from "@boxcar/worker";
import { expect, test } from "vitest";

const MiB = 1024 ** 2;
const ARTIFACT_BYTES = 600_000;
const LEASE_MS = 3_000;

/** A line logged: `level message`, the job it is about, and what it waits to store. */
interface Line {
  line: string;
  jobId?: unknown;
  what?: unknown;
}

/** A logger that keeps each line. */
function noting(lines: Line[], bindings: Record<string, unknown> = {}): Logger {
  const keep = (level: string) => (obj: object, msg?: string) => {
    const fields: Record<string, unknown> = { ...bindings, ...obj };
    lines.push({ line: `${level} ${msg ?? ""}`, jobId: fields.jobId, what: fields.what });
  };
  return {
    debug: keep("debug"),
    info: keep("info"),
    warn: keep("warn"),
    error: keep("error"),
    child: (more) => noting(lines, { ...bindings, ...more }),
  };
}

/** Fills the store to its last byte: messages of halving sizes into a stream of the test's own until JetStream refuses even one byte. */
async function fillToLastByte(nats: NatsFixture, stream: string): Promise<void> {
  const { jsm, js } = nats.topology;
  await jsm.streams.add({ name: stream, subjects: [stream] });
  for (let size = 256 * 1024; size >= 1; ) {
    try {
      await js.publish(stream, new Uint8Array(size));
    } catch {
      size = Math.floor(size / 2);
    }
  }
}

/**
 * A small system whose agent `maker` writes a line of output, waits for the file `go`, then
 * writes another and leaves a 600 KB artifact; a worker (its options as given) logging to `lines`.
 */
async function system(worker: Partial<WorkerOptions>) {
  // A short lease (the pools' ack wait): the waits below outlast it, and the job is not taken over.
  const nats = await natsFixture(
    { streamLimits: { events: MiB, logs: MiB, dead: MiB, submit: MiB }, ackWaitMs: LEASE_MS },
    { maxFileStore: 20 * MiB },
  );
  const dir = await scratch("boxcar-room-");
  const dispatcher = await startDispatcher({ ...nats.dispatcherRole, retentionIntervalMs: 3_600_000 });
  const lines: Line[] = [];
  const start = () => {
    const w = createWorker({
      ...nats.workerRole,
      concurrency: 2,
      providers: [createHostSandboxProvider()],
      logger: noting(lines),
      ...worker,
    });
    void w.run();
    return w;
  };
  const client = createClient(nats.topology);
  // No headroom: the test fills the store to its last byte, and submits in what little it frees.
  await client.setPolicy({ queue: { headroom: 0 } });
  const go = join(dir.path, "go");
  await client.applyAgent({
    name: "maker",
    trusted: true,
    runtime: { sandbox: "host" },
    outputs: ["out/**"],
    command: [
      "sh",
      "-c",
      `echo making; while [ ! -e ${go} ]; do sleep 0.1; done; echo made; mkdir -p out; head -c ${ARTIFACT_BYTES} /dev/urandom > out/a.bin; echo '{"output":"ok"}' > "$BOXCAR_RESULT_FILE"`,
    ],
  });
  await client.applyAgent({ name: "noop", trusted: true, runtime: { sandbox: "host" }, command: ["true"] });
  const filler = `${nats.topology.names.prefix}_FILL`;
  return {
    nats,
    client,
    lines,
    start,
    filler,
    /** Submits a `maker` job, waits for it to run, fills the store, and lets the agent go on. */
    async makerOnAFullStore(): Promise<string> {
      const { job } = await client.submit({ agent: "maker" });
      await eventually(async () => ((await client.getJob(job.id)).state === "running" ? true : undefined), "the job to run");
      await fillToLastByte(nats, filler);
      await writeFile(go, "");
      return job.id;
    },
    /** Says whether a line of the job's was logged (about storing `what`, if given). */
    said: (jobId: string, text: string, what?: string) =>
      lines.some((l) => l.jobId === jobId && l.line.includes(text) && (what === undefined || l.what === what)),
    async [Symbol.asyncDispose]() {
      await dispatcher.close();
      await dir[Symbol.asyncDispose]();
      await nats[Symbol.asyncDispose]();
    },
  };
}

test("a job whose artifact the full store refuses waits for room, its worker taking no new job meanwhile, and succeeds once room frees, never failed", async () => {
  await using sys = await system({});
  const { client, nats } = sys;
  await using worker = sys.start();
  const id = await sys.makerOnAFullStore();
  await eventually(
    async () => (sys.said(id, "JetStream's store is full; waiting for room") ? true : undefined),
    "the attempt to wait for room",
  );
  expect((await client.getJob(id)).state).toBe("running");

  // A little room frees, enough for its output and events but less than the artifact needs: it
  // waits for more. A job admitted in that room is not taken by the worker, which has a free
  // slot, while the attempt waits (the room goes to that attempt first).
  const first = (await nats.topology.jsm.streams.info(sys.filler)).state.first_seq;
  await nats.topology.jsm.streams.deleteMessage(sys.filler, first, false);
  await eventually(
    async () => (sys.said(id, "waiting for room in JetStream's store", "the artifact out/a.bin") ? true : undefined),
    "the artifact to wait for room",
  );
  const other = await eventually(
    async () =>
      client.submit({ agent: "noop" }).then(
        ({ job }) => job.id,
        (err: BoxcarError) => (err.code === "storage_full" ? undefined : Promise.reject(err)),
      ),
    "a job to be admitted in the room freed",
  );
  await sleep(LEASE_MS);
  expect((await client.getJob(other)).state).toBe("queued");
  expect((await client.getJob(id)).state).toBe("running");
  expect(worker.state).toBe("running");

  // Room frees: the attempt goes on, its artifact stored whole and listed; then the other job runs.
  await nats.topology.jsm.streams.delete(sys.filler);
  const done = await client.waitForJob(id);
  expect(done.state).toBe("succeeded");
  expect(done.attempt).toBe(1);
  expect(done.artifacts).toEqual([expect.objectContaining({ path: "out/a.bin", size: ARTIFACT_BYTES })]);
  const stored = await nats.topology.artifacts.getBlob(done.artifacts[0]?.object as string);
  expect(stored?.length).toBe(ARTIFACT_BYTES);
  expect(sys.said(id, "room in JetStream's store again")).toBe(true);
  // Never failed on the way: no such event, no error, and one attempt in its history.
  const types: string[] = [];
  for await (const event of client.events(id)) if (event.kind === "job") types.push(event.type);
  expect(types).toContain("succeeded");
  expect(types).not.toContain("failed");
  expect(done.error).toBeUndefined();
  expect((await client.waitForJob(other)).state).toBe("succeeded");
  // Its output, the line after the store filled refused at first too, was kept.
  const output: string[] = [];
  for await (const chunk of client.logs(id)) output.push(new TextDecoder().decode(chunk.data));
  expect(output.join("")).toBe("making\nmade\n");
}, 120_000);

test("a store that stays full past the worker's room wait fails the job storage_full, saying so, with no artifact half-stored", async () => {
  await using sys = await system({ roomWaitMs: 2_000 });
  const { client, nats } = sys;
  await using _worker = sys.start();
  const id = await sys.makerOnAFullStore();
  // It gives up on its results, then its record, which ends the job, waits: the job ends once there is room for it.
  await eventually(
    async () => (sys.said(id, "JetStream's store is full; waiting for room", "the job's record") ? true : undefined),
    "the attempt to give up on its results and wait to write its record",
  );
  expect(sys.said(id, "JetStream's store stayed full; the attempt waits for room no more")).toBe(true);
  expect((await client.getJob(id)).state).toBe("running");
  await nats.topology.jsm.streams.delete(sys.filler);
  const done = await client.waitForJob(id);
  expect(done.state).toBe("failed");
  expect(done.error).toMatchObject({ code: "storage_full", message: expect.stringContaining("JetStream's store stayed full for 2 s") });
  expect(done.error?.message).toContain("the artifact out/a.bin could not be stored");
  expect(done.artifacts).toEqual([]);
  const objects = (await nats.topology.artifacts.list()).filter((o) => o.name.startsWith(`${id}/`));
  expect(objects).toEqual([]);
}, 120_000);

test("a worker closed while its attempt waits for room hands the job back, and another worker runs it once room frees", async () => {
  await using sys = await system({});
  const { client, nats } = sys;
  const first = sys.start();
  const id = await sys.makerOnAFullStore();
  await eventually(
    async () => (sys.said(id, "JetStream's store is full; waiting for room") ? true : undefined),
    "the attempt to wait for room",
  );
  // Closing does not wait for room: the record is left as it is, the work item handed back.
  await first.close();
  expect(sys.said(id, "leaving it as it is and handing the work item back")).toBe(true);
  expect((await client.getJob(id)).state).toBe("running");

  await nats.topology.jsm.streams.delete(sys.filler);
  await using _second = sys.start();
  const done = await client.waitForJob(id);
  expect(done.state).toBe("succeeded");
  expect(done.attempt).toBe(2);
  expect(done.artifacts).toEqual([expect.objectContaining({ path: "out/a.bin", size: ARTIFACT_BYTES })]);
}, 120_000);
