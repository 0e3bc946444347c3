import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { inputDigest, nowIso, readStream } from "@boxcar/fabric/internal";
import {
  AgentDefinition,
  type AgentDefinitionInput,
  BoxcarEvent,
  type InputFileRef,
  isTerminal,
  JobRecord,
  JobSpec,
  LOCAL_OWNER,
  PROTOCOL_VERSION,
  parseWith,
  unfoldEvents,
  WORK_ITEM_VERSION,
  type WorkItem,
} from "@boxcar/protocol";
import { type NatsFixture, natsFixture } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker, REDACTED, type Worker, type WorkerOptions } from "@boxcar/worker";
import { headers } from "@nats-io/transport-node";
import { afterEach, beforeEach, describe, expect, onTestFinished, test } from "vitest";
import { waitGone } from "./helpers/process.js";

let scratch: string;
beforeEach(async () => {
  scratch = await mkdtemp(join(tmpdir(), "boxcar-worker-test-"));
});
afterEach(async () => {
  await rm(scratch, { recursive: true, force: true });
});

let jobCounter = 0;

/** Records a queued job and publishes its work item, as a dispatcher would. */
async function enqueue(
  nats: Pick<NatsFixture, "topology" | "dispatcherRole">,
  definition: AgentDefinitionInput,
  opts: {
    input?: unknown;
    files?: InputFileRef[];
    timeoutMs?: number;
    newerAgentFields?: Record<string, unknown>;
    /** The item's version: 1 carries the input, 2 its digest (the input stays in the record), later ones are a newer release's. */
    version?: number;
  } = {},
): Promise<string> {
  const { topology } = nats;
  jobCounter += 1;
  const id = `job-${jobCounter}-${randomBytes(3).toString("hex")}`;
  // Trusted: these workers offer only host sandboxes, which the default policy keeps for trusted agents.
  const agent = AgentDefinition.parse({ trusted: true, ...definition });
  const spec = JobSpec.parse({ agent: agent.name, input: opts.input ?? null, files: opts.files ?? [] });
  const now = nowIso();
  const record: JobRecord = {
    v: PROTOCOL_VERSION,
    id,
    agent: agent.name,
    pool: agent.pool,
    state: "queued",
    spec,
    attempt: 0,
    history: [],
    createdAt: now,
    queuedAt: now,
    artifacts: [],
  };
  await topology.jobs.create(id, JSON.stringify(record));
  const version = opts.version ?? 1;
  const item: WorkItem = {
    ...(version === WORK_ITEM_VERSION ? { v: WORK_ITEM_VERSION, inputDigest: inputDigest(spec.input) } : { v: 1, input: spec.input }),
    // A later version, as a release that breaks the format would write.
    ...(version > WORK_ITEM_VERSION ? { v: version as 1 } : {}),
    jobId: id,
    // Fields a later release may add to the agent, which this one does not know.
    agent: { ...agent, ...opts.newerAgentFields },
    files: spec.files,
    timeoutMs: opts.timeoutMs ?? agent.runtime.timeout,
  };
  await publishSigned(nats, topology.names.subjects.work(agent.pool), JSON.stringify(item), id);
  return id;
}

/** Publishes a work item signed as a dispatcher signs it: workers run only what a trusted dispatcher sent. */
async function publishSigned(nats: Pick<NatsFixture, "topology" | "dispatcherRole">, subject: string, text: string, msgID?: string) {
  const body = new TextEncoder().encode(text);
  const hdrs = headers();
  nats.dispatcherRole.signer.sign(subject, body, hdrs);
  await nats.topology.js.publish(subject, body, { headers: hdrs, ...(msgID ? { msgID } : {}) });
}

/** A running worker with its workspaces under the test's scratch folder. */
function startWorker(nats: NatsFixture, opts: Partial<WorkerOptions> = {}): Worker {
  // Host sandboxes only: these tests are about the worker, not a backend (see docker.test.ts).
  const providers = [createHostSandboxProvider({ root: join(scratch, "work") })];
  const worker = createWorker({ ...nats.workerRole, workRoot: join(scratch, "work"), heartbeatMs: 500, providers, ...opts });
  worker.run().catch((err: unknown) => {
    throw err;
  });
  return worker;
}

/** `kind.type` of every event of a job, once its final event is stored. */
/** A job's record once it is final, watched in its bucket (no dispatcher runs here to answer `jobs.get`). */
async function finalRecord(topology: Topology, jobId: string): Promise<JobRecord> {
  const watch = await topology.jobs.watch({ key: jobId });
  try {
    for await (const entry of watch) {
      if (entry.operation !== "PUT") continue;
      const record = parseWith(JobRecord, entry.json(), "job record");
      if (isTerminal(record.state)) return record;
    }
    throw new Error(`stopped watching job ${jobId}`);
  } finally {
    watch.stop();
  }
}

/** A job's events, read from the stream (no dispatcher runs here to answer `jobs.get`), until its final one. */
async function eventsOf(topology: Topology, jobId: string): Promise<BoxcarEvent[]> {
  const events: BoxcarEvent[] = [];
  const subject = topology.names.subjects.jobEvents(LOCAL_OWNER, jobId);
  for await (const msg of readStream(topology, topology.names.streams.events, subject, { follow: true })) {
    const stored = BoxcarEvent.parse(msg.json());
    events.push(...unfoldEvents(stored));
    if (stored.kind === "job" && isTerminal(stored.state)) break;
  }
  return events;
}

const names = (events: BoxcarEvent[]) => events.map((e) => `${e.kind}.${e.type}`);

/** A job's output, read from the stream. */
async function logsOf(topology: Topology, jobId: string): Promise<{ stdout: string; stderr: string }> {
  const out = { stdout: "", stderr: "" };
  for await (const msg of readStream(topology, topology.names.streams.logs, topology.names.subjects.jobLogs(LOCAL_OWNER, jobId))) {
    out[msg.subject.slice(msg.subject.lastIndexOf(".") + 1) as "stdout" | "stderr"] += Buffer.from(msg.data).toString();
  }
  return out;
}

async function eventually<T>(probe: () => Promise<T | undefined>, what: string): Promise<T> {
  for (let i = 0; i < 400; i++) {
    const value = await probe();
    if (value !== undefined) return value;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`gave up waiting for ${what}`);
}

async function recordOf(topology: Topology, jobId: string): Promise<JobRecord> {
  const entry = await topology.jobs.get(jobId);
  if (!entry) throw new Error(`no record for ${jobId}`);
  return entry.json<JobRecord>();
}

/** A logger that keeps every line, to check what the worker writes. */
function captureLogger(lines: string[] = []): Logger & { lines: string[] } {
  const at =
    (bindings: Record<string, unknown>) =>
    (obj: object, msg?: string): void => {
      lines.push(
        JSON.stringify({ ...bindings, ...obj, msg }, (_k, v: unknown) => (v instanceof Error ? { message: v.message, stack: v.stack } : v)),
      );
    };
  const make = (bindings: Record<string, unknown>): Logger & { lines: string[] } => ({
    lines,
    debug: at(bindings),
    info: at(bindings),
    warn: at(bindings),
    error: at(bindings),
    child: (more) => make({ ...bindings, ...more }),
  });
  return make({});
}

const readObject = async (topology: Topology, name: string): Promise<Buffer> => {
  const object = await topology.artifacts.get(name);
  if (!object) throw new Error(`no object ${name}`);
  const data = Buffer.from(await new Response(object.data).arrayBuffer());
  expect(await object.error).toBeFalsy();
  return data;
};

describe("worker", () => {
  test("runs a job: input and files in, events in order, logs, result and byte-exact artifacts out", async () => {
    await using nats = await natsFixture();
    const { topology } = nats;
    const payload = randomBytes(300 * 1024);
    await topology.artifacts.putBlob({ name: "inputs/test/in.bin" }, payload);
    process.env.BOXCAR_WORKER_TEST_LEAK = "worker-only";
    onTestFinished(() => {
      delete process.env.BOXCAR_WORKER_TEST_LEAK;
    });
    await using _worker = startWorker(nats);

    const input = { words: ["a", "b"], n: 2 };
    const id = await enqueue(
      nats,
      {
        name: "echo",
        command: [
          "set -e",
          'test -d out && test -d "$TMPDIR" && test "$HOME" = "$BOXCAR_WORKSPACE" && test "$PWD" = "$BOXCAR_WORKSPACE"',
          'cp "$BOXCAR_INPUT_FILE" out/input.json',
          "mkdir out/nested && cp data/in.bin out/nested/copy.bin",
          "env | sort > env.txt",
          'echo "::progress halfway there"',
          "echo hello on stdout",
          "echo oops on stderr >&2",
          `printf '{"output":{"got":%s},"summary":"all done"}' "$(cat "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"`,
        ].join("\n"),
        env: { GREETING: "hi" },
        outputs: ["out/**", "env.txt"],
      },
      { input, files: [{ path: "data/in.bin", object: "inputs/test/in.bin" }], timeoutMs: 60_000 },
    );

    const record = await finalRecord(nats.topology, id);
    expect(record).toMatchObject({
      state: "succeeded",
      attempt: 1,
      workerId: _worker.id,
      sandbox: { kind: "host" },
      result: { exitCode: 0, signal: null, output: { got: input }, summary: "all done" },
    });
    expect(record.error).toBeUndefined();

    expect(record.artifacts.map((a) => a.path)).toEqual(["env.txt", "out/input.json", "out/nested/copy.bin"]);
    const copy = record.artifacts.find((a) => a.path === "out/nested/copy.bin");
    expect(copy).toEqual({
      path: "out/nested/copy.bin",
      object: `${id}/out/nested/copy.bin`,
      size: payload.length,
      sha256: createHash("sha256").update(payload).digest("hex"),
    });
    expect((await readObject(topology, `${id}/out/nested/copy.bin`)).equals(payload)).toBe(true);
    expect(JSON.parse((await readObject(topology, `${id}/out/input.json`)).toString())).toEqual(input);

    const env = Object.fromEntries(
      (await readObject(topology, `${id}/env.txt`))
        .toString()
        .trim()
        .split("\n")
        .map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]),
    );
    const workspace = env.BOXCAR_WORKSPACE ?? "";
    expect(env).toMatchObject({
      PATH: process.env.PATH,
      HOME: workspace,
      LANG: "C.UTF-8",
      TMPDIR: `${workspace}/.boxcar/tmp`,
      GREETING: "hi",
      BOXCAR_JOB_ID: id,
      BOXCAR_ATTEMPT: "1",
      BOXCAR_AGENT: "echo",
      BOXCAR_INPUT_FILE: `${workspace}/.boxcar/input.json`,
      BOXCAR_RESULT_FILE: `${workspace}/.boxcar/result.json`,
      BOXCAR_USAGE_FILE: `${workspace}/.boxcar/usage.jsonl`,
      BOXCAR_SIGNALS_DIR: `${workspace}/.boxcar/signals`,
      BOXCAR_OUTPUT_DIR: `${workspace}/out`,
    });
    // When the worker will stop it: its 60 s from when it was started, on the worker's clock.
    const stopsIn = Number(env.BOXCAR_STOP_AT) - Date.parse(record.startedAt ?? "");
    expect(stopsIn).toBeGreaterThanOrEqual(60_000);
    expect(stopsIn).toBeLessThan(60_000 + 10_000);
    // Nothing but the contract, and what the shell itself sets.
    expect(
      Object.keys(env)
        .filter((k) => !["PWD", "SHLVL", "_", "OLDPWD"].includes(k))
        .sort(),
    ).toEqual(
      [
        "BOXCAR_AGENT",
        "BOXCAR_ATTEMPT",
        "BOXCAR_CHAIN_FILE",
        "BOXCAR_INPUT_FILE",
        "BOXCAR_JOB_ID",
        "BOXCAR_OUTPUT_DIR",
        "BOXCAR_RESULT_FILE",
        "BOXCAR_SIGNALS_DIR",
        "BOXCAR_STOP_AT",
        "BOXCAR_USAGE_FILE",
        "BOXCAR_WORKSPACE",
      ]
        .concat(["GREETING", "HOME", "LANG", "PATH", "TMPDIR"])
        .sort(),
    );

    const events = await eventsOf(nats.topology, id);
    expect(names(events)).toEqual([
      "job.started",
      "sandbox.creating",
      "sandbox.ready",
      "sandbox.exec_started",
      "job.progress",
      "sandbox.exec_exited",
      "sandbox.destroyed",
      "job.succeeded",
    ]);
    expect(events.find((e) => e.type === "progress")).toMatchObject({ message: "halfway there", attempt: 1 });
    expect(events.find((e) => e.type === "exec_exited")).toMatchObject({ exitCode: 0, signal: null, backend: "host" });
    expect(events.at(-1)).toMatchObject({ state: "succeeded", message: "all done", sandbox: record.sandbox });
    expect(new Set(events.filter((e) => e.kind === "sandbox").map((e) => (e.kind === "sandbox" ? e.sandboxId : "")))).toEqual(
      new Set([record.sandbox?.id]),
    );

    const logs = await logsOf(nats.topology, id);
    expect(logs.stdout).toBe("::progress halfway there\nhello on stdout\n");
    expect(logs.stderr).toBe("oops on stderr\n");

    // The sandbox is gone with its workspace.
    expect(await readdir(join(scratch, "work"))).toEqual([]);
  });

  test("a job that runs too long is killed with its whole process tree and ends timed_out", async () => {
    await using nats = await natsFixture();
    await using _worker = startWorker(nats);
    const pidFile = join(scratch, "grandchild.pid");
    const id = await enqueue(
      nats,
      { name: "sleeper", command: 'sleep 300 & echo $! > "$PID_FILE"; wait', env: { PID_FILE: pidFile } },
      { timeoutMs: 1_000 },
    );

    const record = await finalRecord(nats.topology, id);
    expect(record).toMatchObject({ state: "timed_out", attempt: 1, error: { code: "timed_out" } });
    expect(record.result?.exitCode).toBeNull();
    const grandchild = Number.parseInt(await readFile(pidFile, "utf8"), 10);
    expect(grandchild).toBeGreaterThan(0);
    expect(await waitGone(grandchild)).toBe(true);
    const events = names(await eventsOf(nats.topology, id));
    expect(events.slice(-3)).toEqual(["sandbox.exec_exited", "sandbox.destroyed", "job.timed_out"]);
  });

  test("a cancel on <prefix>.ctl.cancel.<jobId> stops the running job and it ends cancelled", async () => {
    await using nats = await natsFixture();
    await using _worker = startWorker(nats);
    const id = await enqueue(nats, { name: "waiter", command: "echo waiting; sleep 300" });
    await eventually(async () => ((await logsOf(nats.topology, id)).stdout === "waiting\n" ? true : undefined), "the agent to start");

    nats.nc.publish(nats.topology.names.subjects.cancel(id));
    const record = await finalRecord(nats.topology, id);
    expect(record).toMatchObject({ state: "cancelled", attempt: 1, error: { code: "cancelled" } });
    const events = await eventsOf(nats.topology, id);
    expect(names(events).slice(-3)).toEqual(["sandbox.exec_exited", "sandbox.destroyed", "job.cancelled"]);
  });

  test("a malformed work item is terminated with a work_rejected event, and the worker keeps working", async () => {
    await using nats = await natsFixture();
    const { topology } = nats;
    await using worker = startWorker(nats);
    await publishSigned(nats, topology.names.subjects.work("default"), JSON.stringify({ jobId: "x", agent: "nope" }));
    await publishSigned(nats, topology.names.subjects.work("default"), "not json at all");
    const id = await enqueue(nats, { name: "ok", command: "true" });

    expect(await finalRecord(nats.topology, id)).toMatchObject({ state: "succeeded" });
    const rejections: BoxcarEvent[] = [];
    for await (const msg of readStream(
      topology,
      topology.names.streams.events,
      topology.names.subjects.event("worker", worker.id, "work_rejected"),
    )) {
      rejections.push(parseWith(BoxcarEvent, msg.json(), "event"));
    }
    expect(rejections.map((e) => e.kind === "worker" && e.error?.code)).toEqual(["invalid", "bad_json"]);
    expect(worker.state).toBe("running");
    // Terminated and acknowledged: nothing is left to deliver.
    await eventually(
      async () => ((await topology.jsm.streams.info(topology.names.streams.work)).state.messages === 0 ? true : undefined),
      "an empty work stream",
    );
  });

  test.each([
    ["an agent field this one does not know", { newerAgentFields: { gpu: { count: 1 } } }],
    ["a later version", { version: WORK_ITEM_VERSION + 1 }],
  ])(
    "a work item from a newer release (%s) is handed back, not terminated",
    async (_, newer) => {
      await using nats = await natsFixture();
      const { topology } = nats;
      await topology.ensurePoolConsumer("default");
      await using worker = startWorker(nats);
      const id = await enqueue(nats, { name: "later", command: "true" }, newer);
      const consumer = topology.names.poolConsumer("default", "normal");
      // Offered, handed back, offered again: still in the queue, never terminated.
      await eventually(async () => {
        const info = await topology.jsm.consumers.info(topology.names.streams.work, consumer);
        return info.num_redelivered > 0 || info.num_pending + info.num_ack_pending === 0 ? info : undefined;
      }, "the item to be offered again");
      expect((await topology.jsm.streams.info(topology.names.streams.work)).state.messages).toBe(1);
      expect((await topology.jobs.get(id))?.json<JobRecord>().state).toBe("queued");
      const rejected = await topology.jsm.streams.info(topology.names.streams.events, {
        subjects_filter: topology.names.subjects.event("worker", worker.id, "work_rejected"),
      });
      expect(rejected.state.subjects ?? {}).toEqual({});
    },
    30_000,
  );

  test("a version 2 work item runs the input its record holds, and only if it is the one the signed item names", async () => {
    await using nats = await natsFixture();
    const { topology } = nats;
    await using _worker = startWorker(nats);
    const echo = { name: "echo-input", command: 'printf \'{"output":%s}\' "$(cat "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"' };
    const input = { words: "x".repeat(200_000) };
    const byDigest = await enqueue(nats, echo, { input, version: WORK_ITEM_VERSION });
    expect(await finalRecord(topology, byDigest)).toMatchObject({ state: "succeeded", result: { output: input } });

    // The attack: someone who may write job records swaps a queued job's input before a worker
    // takes it. The signed item still names the admitted input by its digest.
    // Its pool has no worker yet, so it waits.
    const swapped = await enqueue(
      nats,
      { ...echo, name: "echo-swapped", pool: "held" },
      { input: { cmd: "admitted" }, version: WORK_ITEM_VERSION },
    );
    const entry = await topology.jobs.get(swapped);
    const record = entry?.json<JobRecord>() as JobRecord;
    await topology.jobs.update(
      swapped,
      JSON.stringify({ ...record, spec: { ...record.spec, input: { cmd: "injected" } } }),
      entry?.revision ?? 0,
    );
    await using _heldWorker = startWorker(nats, { pools: ["held"] });
    const final = await finalRecord(topology, swapped);
    expect(final).toMatchObject({ state: "failed", error: { code: "invalid" } });
    expect(final.error?.message).toContain("digest");
    expect(final.result).toBeUndefined();
  });

  test("an agent that fails, or writes a bad result, fails the job with the reason", async () => {
    await using nats = await natsFixture();
    await using _worker = startWorker(nats);
    const exits = await enqueue(nats, { name: "exits", command: "exit 3" });
    const reports = await enqueue(nats, { name: "reports", command: `echo '{"error":"no network"}' > "$BOXCAR_RESULT_FILE"` });
    const garbles = await enqueue(nats, { name: "garbles", command: `echo '{"summary": 5}' > "$BOXCAR_RESULT_FILE"` });

    expect(await finalRecord(nats.topology, exits)).toMatchObject({
      state: "failed",
      result: { exitCode: 3 },
      error: { code: "agent_failed", message: "agent exited with code 3" },
    });
    expect(await finalRecord(nats.topology, reports)).toMatchObject({
      state: "failed",
      result: { exitCode: 0 },
      error: { code: "agent_failed", message: "no network" },
    });
    const garbled = await finalRecord(nats.topology, garbles);
    expect(garbled).toMatchObject({ state: "failed", error: { code: "bad_result" } });
    expect(garbled.error?.message).toContain("summary");
  });

  test("output beyond maxLogBytes is dropped after one marker", async () => {
    await using nats = await natsFixture();
    await using _worker = startWorker(nats, { maxLogBytes: 4096 });
    const id = await enqueue(nats, { name: "chatty", command: "head -c 100000 /dev/zero | tr '\\0' x" });
    expect(await finalRecord(nats.topology, id)).toMatchObject({ state: "succeeded" });
    const logs = await logsOf(nats.topology, id);
    expect(logs.stdout).toBe("x".repeat(4096));
    expect(logs.stderr).toBe("\n[boxcar: output truncated after 4096 bytes]\n");
  });

  test("a missing secret fails the job before it starts, naming the variable but no value", async () => {
    await using nats = await natsFixture();
    const logger = captureLogger();
    await using _worker = startWorker(nats, { logger, secretsEnv: { PRESENT_SOURCE: "present-value-123" } });
    const id = await enqueue(nats, {
      name: "needs-secrets",
      command: "echo should not run",
      secrets: [
        { name: "PRESENT", from: "PRESENT_SOURCE" },
        { name: "API_TOKEN", from: "BOXCAR_TEST_MISSING_TOKEN" },
      ],
    });

    const record = await finalRecord(nats.topology, id);
    expect(record).toMatchObject({ state: "failed", attempt: 1, error: { code: "missing_secret" } });
    expect(record.error?.message).toContain("BOXCAR_TEST_MISSING_TOKEN");
    const events = await eventsOf(nats.topology, id);
    expect(names(events)).toEqual(["job.failed"]);
    expect(await logsOf(nats.topology, id)).toEqual({ stdout: "", stderr: "" });
    const everything = JSON.stringify([record, events, logger.lines]);
    expect(everything).not.toContain("present-value-123");
  });

  test("a worker hands out only the secrets on its allow-list, however the agent names them", async () => {
    await using nats = await natsFixture();
    process.env.BOXCAR_TEST_ALLOWED = "allowed-value-1";
    process.env.BOXCAR_TEST_WORKERS_OWN = "workers-own-value-2";
    await using _worker = startWorker(nats, { allowSecrets: ["BOXCAR_TEST_ALLOWED"] });
    const ok = await enqueue(nats, {
      name: "allowed",
      command: 'test "$K" = allowed-value-1 || exit 9',
      secrets: [{ name: "K", from: "BOXCAR_TEST_ALLOWED" }],
    });
    const refused = await enqueue(nats, {
      name: "greedy",
      command: "echo should not run",
      secrets: [{ name: "ALLOWED_NAME", from: "BOXCAR_TEST_WORKERS_OWN" }],
    });
    expect((await finalRecord(nats.topology, ok)).state).toBe("succeeded");
    const record = await finalRecord(nats.topology, refused);
    expect(record).toMatchObject({ state: "failed", error: { code: "missing_secret" } });
    expect(record.error?.message).toContain("BOXCAR_TEST_WORKERS_OWN is not on the worker's secrets allow-list");
    expect(record.error?.message).toContain("--allow-secret BOXCAR_TEST_WORKERS_OWN");
    expect(JSON.stringify(record)).not.toContain("workers-own-value-2");
  });

  test("secret values reach the agent but never events, logs, records or the worker's own log", async () => {
    await using nats = await natsFixture();
    const secret = "s3cr3t-Value-9f8e7d";
    const logger = captureLogger();
    await using _worker = startWorker(nats, { logger, secretsEnv: { VAULT_KEY: secret } });
    const quiet = await enqueue(nats, {
      name: "quiet",
      command: 'test "$API_KEY" = "$EXPECTED" || exit 7',
      env: { EXPECTED: "s3cr3t-Value-9f8e7d" },
      secrets: [{ name: "API_KEY", from: "VAULT_KEY" }],
    });
    const leaky = await enqueue(nats, {
      name: "leaky",
      command: `echo "key=$API_KEY"; echo "err $API_KEY" >&2; printf '{"summary":"used %s","output":{"k":"%s"}}' "$API_KEY" "$API_KEY" > "$BOXCAR_RESULT_FILE"`,
      secrets: [{ name: "API_KEY", from: "VAULT_KEY" }],
    });

    const quietRecord = await finalRecord(nats.topology, quiet);
    expect(quietRecord).toMatchObject({ state: "succeeded", result: { exitCode: 0 } });
    const leakyRecord = await finalRecord(nats.topology, leaky);
    expect(leakyRecord).toMatchObject({ state: "succeeded", result: { summary: `used ${REDACTED}`, output: { k: REDACTED } } });
    const leakyLogs = await logsOf(nats.topology, leaky);
    expect(leakyLogs).toEqual({ stdout: `key=${REDACTED}\n`, stderr: `err ${REDACTED}\n` });

    const everything = JSON.stringify([
      quietRecord,
      leakyRecord,
      await eventsOf(nats.topology, quiet),
      await eventsOf(nats.topology, leaky),
      await logsOf(nats.topology, quiet),
      leakyLogs,
      logger.lines,
    ]);
    expect(everything).not.toContain(secret);
  });

  test("drain hands a running job back to the queue, and another worker completes it", async () => {
    await using nats = await natsFixture();
    const { topology } = nats;
    const first = startWorker(nats, { concurrency: 1 });
    const id = await enqueue(nats, {
      name: "slow-first-time",
      command: 'if [ "$BOXCAR_ATTEMPT" = 1 ]; then echo first; sleep 300; fi; echo "attempt $BOXCAR_ATTEMPT done"',
    });
    await eventually(async () => ((await logsOf(nats.topology, id)).stdout === "first\n" ? true : undefined), "the first attempt to start");

    await first.drain(100);
    expect(first.state).toBe("stopped");
    const handedBack = await recordOf(topology, id);
    expect(handedBack).toMatchObject({ state: "queued", attempt: 1 });
    expect(handedBack.workerId).toBeUndefined();
    expect(await topology.workers.get(first.id)).toMatchObject({ operation: "DEL" });

    await using second = startWorker(nats);
    const record = await finalRecord(nats.topology, id);
    expect(record).toMatchObject({ state: "succeeded", attempt: 2, workerId: second.id });
    const events = await eventsOf(nats.topology, id);
    const jobEvents = events.filter((e) => e.kind === "job").map((e) => `${e.type}@${e.attempt}`);
    expect(jobEvents).toEqual(["started@1", "requeued@1", "started@2", "succeeded@2"]);
    const destroyedFirst = events.findIndex((e) => e.type === "destroyed" && e.attempt === 1);
    expect(destroyedFirst).toBeGreaterThan(-1);
    expect(destroyedFirst).toBeLessThan(events.findIndex((e) => e.type === "requeued"));
    expect((await logsOf(nats.topology, id)).stdout).toBe("first\nattempt 2 done\n");
    await first.close();
  });

  test("presence: a running worker advertises itself, and its key is removed when it stops", async () => {
    await using nats = await natsFixture();
    const worker = startWorker(nats, { pools: ["default", "gpu"], concurrency: 3 });
    const info = await eventually(async () => (await nats.topology.workers.get(worker.id))?.json<Record<string, unknown>>(), "presence");
    expect(info).toMatchObject({ id: worker.id, pools: ["default", "gpu"], sandboxes: ["host"], capacity: 3, load: 0, state: "running" });
    await worker.close();
    await worker.close();
    expect(worker.state).toBe("stopped");
    expect(await nats.topology.workers.get(worker.id)).toMatchObject({ operation: "DEL" });
  });
});
