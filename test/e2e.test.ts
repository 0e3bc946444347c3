import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import { BoxcarEvent, isTerminal, JobRecord, OPEN_IDENTITY } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { createWorker, type Worker } from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

const REPO = new URL("..", import.meta.url).pathname;

let nats: NatsFixture;
let dispatcher: Dispatcher;
let workers: Worker[];
let client: BoxcarClient;
let dir: string;

const copyAgent = `
name: copy
description: copies its input file to out/ and reports its checksum
command: |
  echo "copying data.bin"
  mkdir -p out/nested
  cp data.bin out/nested/data.bin
  echo "::progress copied"
  sha256sum data.bin | cut -c1-64 > out/sum.txt
  printf '{"output":{"bytes":%s},"summary":"copied"}' "$(wc -c < data.bin)" > "$BOXCAR_RESULT_FILE"
trusted: true
runtime:
  sandbox: host
  timeout: 30s
`;

beforeAll(async () => {
  nats = await natsFixture();
  dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  workers = [createWorker({ ...nats.workerRole, concurrency: 2 }), createWorker({ ...nats.workerRole, concurrency: 2 })];
  for (const w of workers) void w.run();
  client = createClient(nats.topology);
  dir = await mkdtemp(join(tmpdir(), "boxcar-e2e-"));
  await writeFile(join(dir, "copy.yaml"), copyAgent);
});

afterAll(async () => {
  await Promise.allSettled((workers ?? []).map((w) => w.close()));
  await dispatcher?.close();
  await nats?.[Symbol.asyncDispose]();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const cli = (...args: string[]) => boxcar(nats.url, nats.topology.names.prefix, args);

describe("a job end to end through the CLI", () => {
  test("submit --follow streams it; status, events, logs and artifacts show it; files come back byte-exact", async () => {
    expect((await cli("agent", "apply", "-f", join(dir, "copy.yaml"))).code).toBe(0);
    const data = randomBytes(300 * 1024);
    await writeFile(join(dir, "data.bin"), data);

    const submitted = await cli("submit", "copy", "--file", join(dir, "data.bin"), "--follow", "--json");
    expect(submitted.stderr).toContain('"type":"started"');
    expect(submitted.stdout).toContain("copying data.bin");
    expect(submitted.code).toBe(0);
    const final = JobRecord.parse(JSON.parse(submitted.stdout.slice(submitted.stdout.indexOf("{\n"))));
    expect(final.state).toBe("succeeded");
    expect(final.result).toMatchObject({ exitCode: 0, output: { bytes: data.length }, summary: "copied" });
    expect(final.artifacts.map((a) => a.path).sort()).toEqual(["out/nested/data.bin", "out/sum.txt"]);

    const status = await cli("status", final.id, "--json");
    expect(JobRecord.parse(JSON.parse(status.stdout))).toEqual(final);

    const events = (await cli("events", final.id, "--json")).stdout
      .trim()
      .split("\n")
      .map((line) => BoxcarEvent.parse(JSON.parse(line)));
    const jobTypes = events.filter((e) => e.kind === "job").map((e) => e.type);
    expect(jobTypes).toEqual(["accepted", "queued", "started", "progress", "succeeded"]);
    const sandboxTypes = events.filter((e) => e.kind === "sandbox").map((e) => e.type);
    expect(sandboxTypes).toEqual(["creating", "ready", "exec_started", "exec_exited", "destroyed"]);
    // In order: the sandbox runs between `started` and `succeeded`.
    const at = (pred: (e: BoxcarEvent) => boolean) => events.findIndex(pred);
    expect(at((e) => e.kind === "sandbox" && e.type === "exec_started")).toBeGreaterThan(
      at((e) => e.kind === "job" && e.type === "started"),
    );
    expect(at((e) => e.kind === "job" && e.type === "succeeded")).toBe(events.length - 1);

    const logs = await cli("logs", final.id);
    expect(logs.stdout).toBe("copying data.bin\n::progress copied\n");

    const out = join(dir, "artifacts");
    expect((await cli("artifacts", final.id, "--out", out)).code).toBe(0);
    expect((await readFile(join(out, "out/nested/data.bin"))).equals(data)).toBe(true);
    const { createHash } = await import("node:crypto");
    expect((await readFile(join(out, "out/sum.txt"), "utf8")).trim()).toBe(createHash("sha256").update(data).digest("hex"));
  });

  test("submit --wait exits 1 when the job fails, and status explains why", async () => {
    expect((await cli("agent", "apply", "-f", join(REPO, "examples/agents/fail.yaml"))).code).toBe(0);
    const run = await cli("submit", "fail", "--wait");
    expect(run.code).toBe(1);
    expect(run.stdout).toMatch(/state\s+failed/);
    expect(run.stdout).toContain("agent_failed");
  });

  test("submit --input-file takes an input larger than a command-line argument may be (128 KiB)", async () => {
    await client.applyAgent({
      name: "measure",
      command: 'printf \'{"output":%s}\' "$(wc -c < "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"',
      trusted: true,
      runtime: { sandbox: "host" },
    });
    const input = { text: "x".repeat(200_000) };
    const file = join(dir, "big-input.json");
    await writeFile(file, JSON.stringify(input));
    const run = await cli("submit", "measure", "--input-file", file, "--wait", "--json");
    expect(run.code, run.stderr).toBe(0);
    const job = JSON.parse(run.stdout) as JobRecord;
    expect([job.state, job.result?.output, job.spec?.input]).toEqual(["succeeded", JSON.stringify(input).length, input]);

    const both = await cli("submit", "measure", "--input", "1", "--input-file", file);
    expect([both.code, both.stderr]).toEqual([2, expect.stringContaining("give --input or --input-file, not both")]);
    const missing = await cli("submit", "measure", "--input-file", join(dir, "nowhere.json"));
    expect([missing.code, missing.stderr]).toEqual([2, expect.stringContaining(`cannot read input file ${join(dir, "nowhere.json")}`)]);
    await writeFile(join(dir, "bad-input.json"), "{oops");
    const bad = await cli("submit", "measure", "--input-file", join(dir, "bad-input.json"));
    expect([bad.code, bad.stderr]).toEqual([2, expect.stringContaining("is not valid JSON")]);
  });

  test("jobs, workers and agent ls list what is there", async () => {
    const agents = await cli("agent", "ls");
    expect(agents.stdout).toMatch(/^NAME\s+POOL/);
    expect(agents.stdout).toContain("copy");
    const list = await cli("workers", "--json");
    expect(
      JSON.parse(list.stdout)
        .map((w: { id: string }) => w.id)
        .sort(),
    ).toEqual(workers.map((w) => w.id).sort());
    const jobs = await cli("jobs", "--state", "succeeded");
    expect(jobs.stdout).toMatch(/^JOB\s+AGENT\s+STATE/);
    expect(jobs.stdout).toContain("copy");
  });

  test("bad input on the command line is a clear usage error (exit 2) and sends nothing", async () => {
    const bad = join(dir, "bad.yaml");
    await writeFile(bad, "name: broken\ncommand: echo\nruntime:\n  timeout: soon\n  network: '!!'\n");
    const apply = await cli("agent", "apply", "-f", bad);
    expect(apply.code).toBe(2);
    expect(apply.stderr).toContain(`${bad}:4:3: runtime.timeout`);
    expect(apply.stderr).toContain(`${bad}:5:3: runtime.network`);
    await expect(client.getAgent("broken")).rejects.toMatchObject({ code: "not_found" });

    const flag = await cli("submit", "copy", "--no-such-flag");
    expect(flag.code).toBe(2);
    expect(flag.stderr).toContain("--no-such-flag");
    const json = await cli("submit", "copy", "--input", "{oops");
    expect(json.code).toBe(2);
    expect(json.stderr).toContain("--input is not valid JSON");
    const unknown = await cli("submit", "nobody");
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toContain("unknown_agent");
  });
});

describe("a job end to end over raw NATS", () => {
  test("request/reply submit, then the KV record and Object Store artifacts, with no Boxcar client code", async () => {
    await client.applyAgent({
      name: "raw",
      command: ["sh", "-c", 'mkdir -p out; cat "$BOXCAR_INPUT_FILE" > out/input.json'],
      trusted: true,
      runtime: { sandbox: "host" },
    });
    const { names } = nats.topology;
    const reply = await nats.nc.request(
      names.subjects.api(OPEN_IDENTITY, "jobs.submit"),
      JSON.stringify({ agent: "raw", input: { hello: "world" } }),
      {
        timeout: 5_000,
      },
    );
    const { ok, data } = reply.json<{ ok: boolean; data: { job: { id: string } } }>();
    expect(ok).toBe(true);
    const id = data.job.id;
    const record = await eventually(async () => {
      const entry = await nats.topology.jobs.get(id);
      const job = entry ? JobRecord.parse(entry.json()) : undefined;
      return job && isTerminal(job.state) ? job : undefined;
    }, "the job to finish");
    expect(record.state).toBe("succeeded");
    const blob = await nats.topology.artifacts.getBlob(`${id}/out/input.json`);
    expect(JSON.parse(new TextDecoder().decode(blob ?? new Uint8Array()))).toEqual({ hello: "world" });
  });

  test("a fire-and-forget submission on the intake subject runs", async () => {
    await nats.topology.js.publish(
      nats.topology.names.subjects.submit("local", "raw"),
      JSON.stringify({ input: 7, idempotencyKey: "ff-1" }),
    );
    const job = await eventually(
      async () => (await client.listJobs({ agent: "raw" })).jobs.find((j) => j.spec?.idempotencyKey === "ff-1" && isTerminal(j.state)),
      "the intake job",
    );
    expect(job.state).toBe("succeeded");
  });
});

describe("scale and restarts", () => {
  test("several workers share a pool and each job runs exactly once", async () => {
    await client.applyAgent({ name: "tick", command: "echo tick", trusted: true, runtime: { sandbox: "host" } });
    const ids = await Promise.all(Array.from({ length: 24 }, (_, i) => client.submit({ agent: "tick", input: i }).then((r) => r.job.id)));
    const finals = await Promise.all(ids.map((id) => client.waitForJob(id)));
    expect(finals.every((j) => j.state === "succeeded" && j.attempt === 1)).toBe(true);
    expect(new Set(finals.map((j) => j.workerId)).size).toBe(2);
    for (const id of ids.slice(0, 6)) {
      const started = [];
      for await (const e of client.events(id)) if (e.kind === "job" && e.type === "started") started.push(e);
      expect(started).toHaveLength(1);
    }
  });

  test("two dispatchers at once share the API and the intake: every submission becomes exactly one job", async () => {
    await using second = await startDispatcher({ ...nats.dispatcherRole });
    const { js, names } = nats.topology;
    const viaApi = await Promise.all(
      Array.from({ length: 10 }, (_, i) => client.submit({ agent: "tick", input: i, labels: { batch: "two" } })),
    );
    for (let i = 0; i < 10; i++)
      await js.publish(names.subjects.submit("local", "tick"), JSON.stringify({ input: 100 + i, labels: { batch: "two" } }));
    const jobs = await eventually(async () => {
      const found = (await client.listJobs({ agent: "tick", limit: 1000 })).jobs.filter((j) => j.spec?.labels.batch === "two");
      return found.length >= 20 && found.every((j) => j.state === "succeeded") ? found : undefined;
    }, "20 jobs to succeed");
    expect(jobs).toHaveLength(20);
    expect(new Set(jobs.map((j) => j.spec?.input)).size).toBe(20);
    expect(new Set(viaApi.map((r) => r.job.id)).size).toBe(10);
    expect(second.id).not.toBe(dispatcher.id);
  });

  test("a dispatcher restart loses no submission made on the intake subject", async () => {
    await dispatcher.close();
    const { js, names } = nats.topology;
    for (let i = 0; i < 15; i++)
      await js.publish(names.subjects.submit("local", "tick"), JSON.stringify({ input: i, labels: { batch: "restart" } }));
    dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    // A submission that reached the stopped dispatcher's last pull (its inbox gone) waits out the
    // intake consumer's 30 s ack wait before it is delivered again (CI once took longer than 20 s).
    const done = await eventually(
      async () => {
        const jobs = (await client.listJobs({ agent: "tick", limit: 1000 })).jobs.filter((j) => j.spec?.labels.batch === "restart");
        return jobs.length === 15 && jobs.every((j) => j.state === "succeeded") ? jobs : undefined;
      },
      "15 intake jobs to succeed",
      45_000,
    );
    expect(new Set(done.map((j) => j.spec?.input)).size).toBe(15);
  });
});

describe("what a mistaken command line gets", () => {
  test("no dispatcher, a mistyped prefix and a bad prefix are clear errors that create nothing", async () => {
    await using bare = await natsFixture(); // a Boxcar system with no dispatcher running
    const noDispatcher = await boxcar(bare.url, bare.topology.names.prefix, ["submit", "anything"]);
    expect(noDispatcher.code).toBe(4);
    expect(noDispatcher.stderr).toContain("no dispatcher answers");

    const streamsBefore = await streamNames(bare);
    const typo = await boxcar(bare.url, "typo", ["status", "x"]);
    expect(typo.code).toBe(4);
    expect(typo.stderr).toContain("no dispatcher answers on typo.api.");
    expect(typo.stderr).toContain("with prefix typo?");
    expect(await streamNames(bare)).toEqual(streamsBefore);

    const badPrefix = await boxcar(bare.url, "Not Valid", ["jobs"]);
    expect(badPrefix.code).toBe(2);
    expect(badPrefix.stderr).toContain("--prefix");

    const extra = await boxcar(bare.url, bare.topology.names.prefix, ["workers", "extra"]);
    expect(extra.code).toBe(2);
    expect(extra.stderr).toContain('unexpected argument "extra"');
  });

  test("a refused submission with --file leaves no uploaded file behind", async () => {
    const objectsBefore = (await nats.topology.artifacts.list()).length;
    await writeFile(join(dir, "note.txt"), "hello");
    const refused = await cli("submit", "nobody", "--file", join(dir, "note.txt"));
    expect(refused.code).toBe(3);
    const badTimeout = await cli("submit", "copy", "--file", join(dir, "note.txt"), "--timeout", "forever");
    expect(badTimeout.code).toBe(3);
    expect(badTimeout.stderr).toContain("timeout");
    expect((await nats.topology.artifacts.list()).length).toBe(objectsBefore);
  });
});

async function streamNames(fixture: NatsFixture): Promise<string[]> {
  const names: string[] = [];
  for await (const name of fixture.topology.jsm.streams.names()) names.push(name);
  return names.sort();
}
