/**
 * A store filled to its last byte recovers (issue 44, item 3): one `clean` deletes every ended
 * job whole (record, events, output, files) writing nothing before it has freed room, keeps whole
 * and says why the one whose file a running job uses, and the queued jobs then run, with no other
 * command. Against a real nats-server with a small store, the dispatcher on its own credential.
 */

import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import type { BoxcarError } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture, scratch } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

const MiB = 1024 ** 2;
const host = { trusted: true, runtime: { sandbox: "host" as const } };

/** How many messages a subject holds in a stream. */
async function held(nats: NatsFixture, stream: string, subject: string): Promise<number> {
  const info = await nats.topology.jsm.streams.info(stream, { subjects_filter: subject });
  return Object.values(info.state.subjects ?? {}).reduce((a, b) => a + b, 0);
}

/** Everything the store holds of a job: its record's messages, events, output lines, and each object's metadata and chunks. */
async function leftOf(nats: NatsFixture, id: string, objects: { name: string; nuid: string }[]) {
  const { names } = nats.topology;
  const bucket = names.buckets.artifacts;
  const encoded = (name: string) => Buffer.from(name).toString("base64").replaceAll("+", "-").replaceAll("/", "_");
  let objectMessages = 0;
  for (const o of objects) {
    objectMessages += await held(nats, `OBJ_${bucket}`, `$O.${bucket}.M.${encoded(o.name)}`);
    objectMessages += await held(nats, `OBJ_${bucket}`, `$O.${bucket}.C.${o.nuid}`);
  }
  return {
    record: await held(nats, `KV_${names.buckets.jobs}`, `$KV.${names.buckets.jobs}.${id}`),
    events: await held(nats, names.streams.events, names.subjects.jobEvents("local", id)),
    logs: await held(nats, names.streams.logs, names.subjects.jobLogs("local", id)),
    objects: objectMessages,
  };
}

/**
 * Fills the store to its last byte: messages of halving sizes into a stream of the test's own
 * until JetStream refuses even one byte.
 */
async function fillToLastByte(nats: NatsFixture, prefix: string): Promise<void> {
  const { jsm, js } = nats.topology;
  await jsm.streams.add({ name: `${prefix}_FILL`, subjects: [`${prefix}-fill`] });
  for (let size = 256 * 1024; size >= 1; ) {
    try {
      await js.publish(`${prefix}-fill`, new Uint8Array(size));
    } catch {
      size = Math.floor(size / 2);
    }
  }
}

test("a store filled to its last byte: one clean deletes every ended job whole, keeps whole the one a running job needs and says why, and the queued jobs then run", async () => {
  const streamLimits = { events: MiB, logs: MiB, dead: MiB, submit: MiB };
  await using nats = await natsFixture({ streamLimits }, { maxFileStore: 20 * MiB });
  await using dir = await scratch("boxcar-full-");
  const prefix = nats.topology.names.prefix;
  const dispatcher = await startDispatcher({ ...nats.dispatcherRole, retentionIntervalMs: 3_600_000 });
  const worker = createWorker({ ...nats.workerRole, concurrency: 4, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  try {
    await client.setPolicy({ retention: { jobs: "1h" } });
    // Writes output and a 150 KB artifact; its input (60 KB) is in its record.
    await client.applyAgent({
      name: "maker",
      ...host,
      outputs: ["out/**"],
      command: [
        "sh",
        "-c",
        'echo making; mkdir -p out; head -c 150000 /dev/urandom > out/a.bin; echo \'{"output":"ok"}\' > "$BOXCAR_RESULT_FILE"',
      ],
    });
    await client.applyAgent({ name: "waiter", ...host, command: ["sleep", "120"] });
    // Runs only where a worker serves pool "later": none until the end.
    await client.applyAgent({ name: "later", ...host, pool: "later", command: ["true"] });
    const pad = "x".repeat(60_000);

    // Ended jobs: 24 whose events and output have since left their streams (pushed out by newer
    // ones, as a busy system's are), then 4 that still have theirs, one of them with an input
    // file that a job still running also has.
    const made: string[] = [];
    const run = async (n: number, files: Awaited<ReturnType<typeof client.uploadInput>>[] = []) => {
      const jobs = await Promise.all(Array.from({ length: n }, (_, i) => client.submit({ agent: "maker", input: { i, pad }, files })));
      for (const { job } of jobs) {
        expect((await client.waitForJob(job.id)).state).toBe("succeeded");
        made.push(job.id);
      }
    };
    await run(24);
    // Newer jobs' events and output push theirs out (each stream holds 1 MiB, the oldest dropped).
    for (const subject of [`${prefix}.evt.job.nobody.none.filler`, `${prefix}.log.nobody.none.filler`]) {
      for (let i = 0; i < 20; i++) await nats.topology.js.publish(subject, new Uint8Array(64 * 1024));
    }
    await run(3);
    await writeFile(join(dir.path, "shared.txt"), "shared\n");
    const shared = await client.uploadInput(join(dir.path, "shared.txt"), "shared.txt");
    const { job: waiter } = await client.submit({ agent: "waiter", files: [shared] });
    await eventually(async () => ((await client.getJob(waiter.id)).state === "running" ? true : undefined), "the waiter to run");
    await run(1, [shared]);
    const sharing = made[made.length - 1] as string;

    // What each ended job holds in the store, read while it is there.
    const objectsOf = async (id: string) => {
      const job = await client.getJob(id);
      const names = [...job.artifacts.map((a) => a.object), ...(job.spec?.files ?? []).map((f) => f.object)];
      return Promise.all(names.map(async (name) => ({ name, nuid: (await nats.topology.artifacts.info(name))?.nuid ?? "" })));
    };
    const objects = new Map<string, { name: string; nuid: string }[]>();
    for (const id of made) objects.set(id, await objectsOf(id));
    const before = await leftOf(nats, sharing, objects.get(sharing) ?? []);
    expect(before).toMatchObject({ record: 1, objects: 5 }); // the artifact (metadata, 2 chunks), the input (metadata, a chunk)
    expect(before.events).toBeGreaterThan(0);
    expect(before.logs).toBeGreaterThan(0);
    expect((await leftOf(nats, made[0] as string, [])).events).toBe(0); // pushed out

    // Queued jobs until the store refuses them, then the last bytes.
    const queued: string[] = [];
    for (let i = 0; ; i++) {
      try {
        queued.push((await client.submit({ agent: "later", input: { i, pad: "y".repeat(100_000) } })).job.id);
      } catch (err) {
        expect((err as BoxcarError).code).toBe("storage_full");
        break;
      }
    }
    expect(queued.length).toBeGreaterThan(10);
    await fillToLastByte(nats, prefix);
    await expect(nats.topology.js.publish(`${prefix}-fill`, new Uint8Array(1))).rejects.toThrow(/insufficient resources/);

    // One clean: every ended job but one deleted, each whole; the one kept, whole, with why.
    const cleaned = await client.cleanJobs({ olderThan: 0 });
    expect(cleaned).toEqual({
      deleted: made.length - 1,
      kept: 1,
      keptJobs: [
        { id: sharing, reason: "file_in_use", message: expect.stringContaining(`an input of job ${waiter.id}, which has not ended`) },
      ],
      more: false,
    });
    for (const id of made.filter((j) => j !== sharing)) {
      // Nothing but its record's delete marker, which a later pass purges.
      expect(await leftOf(nats, id, objects.get(id) ?? []), `job ${id}`).toEqual({ record: 1, events: 0, logs: 0, objects: 0 });
    }
    expect(await leftOf(nats, sharing, objects.get(sharing) ?? [])).toEqual(before);
    // Every dispatcher forgets the deleted jobs: their delete markers were written.
    await eventually(
      async () => ((await client.countJobs()).total === queued.length + 2 ? true : undefined),
      "the counts to leave out the deleted jobs",
    );

    // The command line says which job it kept and why; --json lists them.
    const said = await boxcar(nats.url, prefix, ["clean", "--older-than", "0s"]);
    expect(said.code, said.stderr).toBe(0);
    expect(said.stdout).toContain("deleted 0 ended jobs; 1 kept:");
    expect(said.stdout).toContain(`  ${sharing}: `);
    expect(said.stdout).toContain(`an input of job ${waiter.id}, which has not ended`);
    const listed = await boxcar(nats.url, prefix, ["clean", "--older-than", "0s", "--json"]);
    expect(JSON.parse(listed.stdout)).toMatchObject({ deleted: 0, kept: 1, keptJobs: [{ id: sharing, reason: "file_in_use" }] });

    // With no other command, the queued jobs run once a worker of their pool starts.
    await using later = createWorker({ ...nats.workerRole, pools: ["later"], concurrency: 4, providers: [createHostSandboxProvider()] });
    void later.run();
    await eventually(
      async () => ((await client.countJobs({ agent: "later" })).counts.succeeded === queued.length ? true : undefined),
      "the queued jobs to run",
      60_000,
    );
    await client.cancelJob(waiter.id);
  } finally {
    await worker.close();
    await dispatcher.close();
  }
}, 120_000);

test("once the store has been full, new work is refused while less than the headroom is free, and the jobs admitted run in it", async () => {
  const streamLimits = { events: MiB, logs: MiB, dead: MiB, submit: MiB };
  await using nats = await natsFixture({ streamLimits }, { maxFileStore: 14 * MiB });
  const dispatcher = await startDispatcher({ ...nats.dispatcherRole, retentionIntervalMs: 3_600_000 });
  const worker = createWorker({ ...nats.workerRole, concurrency: 4, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  const { jsm } = nats.topology;
  try {
    await client.setPolicy({ retention: { jobs: "1h" }, queue: { headroom: "1Mi" } });
    await client.applyAgent({ name: "quick", ...host, command: ["true"] });
    await client.applyAgent({ name: "later", ...host, pool: "later", command: ["true"] });
    const pad = "x".repeat(100_000);
    const ended = await Promise.all(Array.from({ length: 30 }, (_, i) => client.submit({ agent: "quick", input: { i, pad } })));
    for (const { job } of ended) expect((await client.waitForJob(job.id)).state).toBe("succeeded");

    /** Submits jobs no worker runs yet until one is refused; resolves with how many were admitted and the refusal. */
    const fill = async () => {
      const admitted: string[] = [];
      for (let i = 0; ; i++) {
        try {
          admitted.push((await client.submit({ agent: "later", input: { i, pad } })).job.id);
        } catch (err) {
          return { admitted, refusal: err as BoxcarError };
        }
      }
    };
    // The first time, JetStream itself refuses: the store is full, and the dispatcher learns its size.
    const first = await fill();
    expect(first.refusal.code).toBe("storage_full");
    expect(first.refusal.message).toContain("its store is full");
    const full = (await jsm.getAccountInfo()).storage;
    expect(full).toBeGreaterThan(14 * MiB - 200_000);

    // Room freed (3 MB), the store fills again only to the headroom: refused with 1 MiB still free.
    expect(await client.cleanJobs({ olderThan: 0 })).toMatchObject({ deleted: 30, kept: 0 });
    const second = await fill();
    expect(second.admitted.length).toBeGreaterThan(0);
    expect(second.refusal).toMatchObject({
      code: "storage_full",
      message: expect.stringContaining("the last 1 MiB are kept for the jobs already admitted"),
    });
    const free = 14 * MiB - (await jsm.getAccountInfo()).storage;
    expect(free).toBeGreaterThan(MiB - 150_000);

    // In that room, every job admitted runs to its end (each rewrites its 100 KB record as it goes).
    const queued = first.admitted.length + second.admitted.length;
    await using later = createWorker({ ...nats.workerRole, pools: ["later"], concurrency: 4, providers: [createHostSandboxProvider()] });
    void later.run();
    await eventually(
      async () => ((await client.countJobs({ agent: "later" })).counts.succeeded === queued ? true : undefined),
      "the admitted jobs to run",
      60_000,
    );
  } finally {
    await worker.close();
    await dispatcher.close();
  }
}, 120_000);
