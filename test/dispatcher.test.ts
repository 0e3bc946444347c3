import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { inputDigest } from "@boxcar/fabric/internal";
import { ErrorCode, JobRecord, MAX_SPEC_BYTES, OPEN_IDENTITY, RuntimePolicy } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { Svcm } from "@nats-io/services";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

const echoAgent = { name: "echo", command: ["sh", "-c", "echo hi"], trusted: true, runtime: { sandbox: "host", timeout: "10s" } };

let nats: NatsFixture;
let dispatcher: Awaited<ReturnType<typeof startDispatcher>>;

beforeAll(async () => {
  nats = await natsFixture();
  dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  await createClient(nats.topology).applyAgent(echoAgent);
});
afterAll(async () => {
  await dispatcher?.close();
  await nats?.[Symbol.asyncDispose]();
});

/** A request on the raw API subject, as a client in any language would send it. */
async function rawRequest(endpoint: string, body: string | Uint8Array) {
  const msg = await nats.nc.request(nats.topology.names.subjects.api(OPEN_IDENTITY, endpoint as never), body, { timeout: 5_000 });
  return {
    reply: msg.json<{ ok: boolean; data?: unknown; error?: { code: string; message: string; issues?: { path: string }[] } }>(),
    msg,
  };
}

async function workStreamMessages(): Promise<number> {
  return (await nats.topology.jsm.streams.info(nats.topology.names.streams.work)).state.messages;
}

describe("the request/reply API", () => {
  test("is a NATS service that $SRV.PING finds", async () => {
    const found = [];
    for await (const ping of await new Svcm(nats.nc).client().ping(nats.topology.names.serviceName)) found.push(ping);
    expect(found).toHaveLength(1);
    expect(found[0]?.metadata?.dispatcherId).toBe(dispatcher.id);
  });

  test("jobs.submit gives an id, records the job and enqueues one work item", async () => {
    const before = await workStreamMessages();
    const { reply } = await rawRequest("jobs.submit", JSON.stringify({ agent: "echo", input: { n: 1 } }));
    expect(reply.ok).toBe(true);
    const job = JobRecord.parse((reply.data as { job: unknown }).job);
    expect(job.state).toBe("queued");
    expect(job.spec?.input).toEqual({ n: 1 });
    const stored = await nats.topology.jobs.get(job.id);
    expect(JobRecord.parse(stored?.json()).id).toBe(job.id);
    expect(await workStreamMessages()).toBe(before + 1);
  });

  test("a job's input is stored once: its work item names it by digest, unless a live worker of an earlier release could take the item", async () => {
    const client = createClient(nats.topology);
    const { names } = nats.topology;
    const lastItem = async (job: JobRecord) =>
      (await nats.topology.jsm.streams.getMessage(names.streams.work, { last_by_subj: names.subjects.work(job.pool, job.priority) }))?.json<
        Record<string, unknown>
      >();
    const input = { text: "x".repeat(100_000) };
    const { job } = await client.submit({ agent: "echo", input });
    const item = await lastItem(job);
    expect(item).toMatchObject({ v: 2, jobId: job.id, inputDigest: inputDigest(input) });
    expect(item).not.toHaveProperty("input");
    expect(JSON.stringify(item).length).toBeLessThan(2_000);

    // A live worker of an earlier release (its presence names no work item versions) could not read that.
    const now = new Date().toISOString();
    const older = { v: 1, id: "older", host: "h", pid: 1, pools: ["default"], sandboxes: ["host"], policy: RuntimePolicy.parse({}) };
    await nats.topology.workers.put(
      "older",
      JSON.stringify({ ...older, capacity: 1, load: 0, jobs: [], state: "running", startedAt: now, heartbeatAt: now, heartbeatMs: 60_000 }),
    );
    try {
      const during = await eventually(async () => {
        const { job: next } = await client.submit({ agent: "echo", input });
        const nextItem = await lastItem(next);
        return nextItem?.v === 1 ? nextItem : undefined;
      }, "an item that carries its input");
      expect(during).toMatchObject({ input });
      expect(during).not.toHaveProperty("inputDigest");
    } finally {
      await nats.topology.workers.delete("older");
    }
  });

  test("an idempotency key returns the first job and enqueues nothing more", async () => {
    const client = createClient(nats.topology);
    const first = await client.submit({ agent: "echo", idempotencyKey: "order-42" });
    const count = await workStreamMessages();
    const second = await client.submit({ agent: "echo", idempotencyKey: "order-42" });
    expect(first.duplicate).toBe(false);
    expect(second.duplicate).toBe(true);
    expect(second.job.id).toBe(first.job.id);
    expect(await workStreamMessages()).toBe(count);
  });

  test.each([
    ["not JSON", "{nope", ErrorCode.badJson, []],
    [
      "a schema violation",
      JSON.stringify({ agent: "echo", timeout: "forever", files: [{ path: "../x", object: "o" }] }),
      ErrorCode.invalid,
      ["timeout", "files[0].path"],
    ],
    ["an unknown agent", JSON.stringify({ agent: "nobody" }), ErrorCode.unknownAgent, ["agent"]],
    [
      "a missing input file",
      JSON.stringify({ agent: "echo", files: [{ path: "a.txt", object: "inputs/none" }] }),
      ErrorCode.inputFileMissing,
      ["files[0].object"],
    ],
    ["an oversized spec", JSON.stringify({ agent: "echo", input: "x".repeat(MAX_SPEC_BYTES) }), ErrorCode.tooLarge, []],
  ])("%s is refused with code and field paths, and nothing is enqueued", async (_what, body, code, paths) => {
    const before = await workStreamMessages();
    const jobsBefore = (await nats.topology.jobs.status()).values;
    const { reply, msg } = await rawRequest("jobs.submit", body);
    expect(reply.ok).toBe(false);
    expect(reply.error?.code).toBe(code);
    expect(reply.error?.message).toBeTruthy();
    expect((reply.error?.issues ?? []).map((i) => i.path)).toEqual(expect.arrayContaining(paths));
    expect(msg.headers?.get("Nats-Service-Error-Code")).toMatch(/^4\d\d$/);
    expect(await workStreamMessages()).toBe(before);
    expect((await nats.topology.jobs.status()).values).toBe(jobsBefore);
  });

  test("jobs.get, jobs.list (filtered, paged) and jobs.cancel of a queued job", async () => {
    const client = createClient(nats.topology);
    const ids = [];
    for (let i = 0; i < 5; i++) ids.push((await client.submit({ agent: "echo", input: i })).job.id);
    expect((await client.getJob(ids[0] as string)).id).toBe(ids[0]);

    const page1 = await client.listJobs({ agent: "echo", state: "queued", limit: 3 });
    expect(page1.jobs).toHaveLength(3);
    expect(page1.next).toBeDefined();
    const page2 = await client.listJobs({ agent: "echo", state: "queued", limit: 3, after: page1.next });
    const listed = [...page1.jobs, ...page2.jobs].map((j) => j.id);
    expect(listed).toEqual(expect.arrayContaining(ids));
    expect(new Set(listed).size).toBe(listed.length);
    expect(listed).toEqual([...listed].sort().reverse());

    const cancelled = await client.cancelJob(ids[1] as string);
    expect(cancelled.state).toBe("cancelled");
    expect((await client.cancelJob(ids[1] as string)).state).toBe("cancelled"); // idempotent
    expect((await client.listJobs({ state: "cancelled" })).jobs.map((j) => j.id)).toContain(ids[1]);

    // By pool: a job sent to another pool is listed there and not in the agent's own.
    const elsewhere = (await client.submit({ agent: "echo", pool: "elsewhere" })).job.id;
    expect((await client.listJobs({ pool: "elsewhere" })).jobs.map((j) => j.id)).toEqual([elsewhere]);
    expect((await client.listJobs({ agent: "echo", pool: "default", limit: 1000 })).jobs.map((j) => j.id)).not.toContain(elsewhere);
  });

  test("jobs.count: how many jobs are in each state, everyone's or one agent's; a submitter counts only its own", async () => {
    const client = createClient(nats.topology);
    await client.applyAgent({ ...echoAgent, name: "counted" });
    const ids = [];
    for (let i = 0; i < 3; i++) ids.push((await client.submit({ agent: "counted" })).job.id);
    await client.cancelJob(ids[0] as string);
    // The count comes from the dispatcher's index, which its watch of the bucket keeps.
    const counted = await eventually(async () => {
      const reply = await client.countJobs({ agent: "counted" });
      return reply.counts.cancelled === 1 ? reply : undefined;
    }, "the cancel to be counted");
    expect(counted.total).toBe(3);
    expect(Object.entries(counted.counts).filter(([, n]) => n > 0)).toEqual([
      ["queued", 2],
      ["cancelled", 1],
    ]);
    expect((await client.countJobs()).total).toBeGreaterThan(3); // the other tests' jobs too

    const prefix = nats.topology.names.prefix;
    await nats.auth.mint("counter", "submitter");
    const asCounter = { NATS_CREDS: nats.auth.credsFile("counter") };
    expect((await boxcar(nats.url, prefix, ["submit", "counted"], asCounter)).code).toBe(0);
    const own = await eventually(async () => {
      const r = await boxcar(nats.url, prefix, ["jobs", "--counts", "--json"], asCounter);
      const reply = JSON.parse(r.stdout) as { total: number; counts: Record<string, number> };
      return reply.total === 1 ? reply : undefined;
    }, "the submitter's one job to be counted");
    expect(own.counts.queued).toBe(1);
    const printed = await boxcar(nats.url, prefix, ["jobs", "--counts", "--agent", "counted"]);
    expect(printed.stdout.split("\n").map((l) => l.split(/\s+/).filter(Boolean).join(" "))).toEqual(
      expect.arrayContaining(["queued 3", "cancelled 1", "total 4"]),
    );
    const usage = await boxcar(nats.url, prefix, ["jobs", "--counts", "--state", "queued"]);
    expect(usage).toMatchObject({ code: 2, stderr: expect.stringContaining("--counts takes only --agent, not --state") });
    await client.removeAgent("counted");
  });

  test("unknown ids are not_found; agents can be applied, listed, read and removed", async () => {
    const client = createClient(nats.topology);
    await expect(client.getJob("nope")).rejects.toMatchObject({ code: ErrorCode.notFound });
    await expect(client.cancelJob("nope")).rejects.toMatchObject({ code: ErrorCode.notFound });
    await expect(client.getJob("a b*")).rejects.toMatchObject({
      code: ErrorCode.invalid,
      issues: [expect.objectContaining({ path: "id" })],
    });
    const applied = await client.applyAgent({ name: "tmp", command: "true" });
    expect(applied).toMatchObject({ created: true, agent: { name: "tmp", command: ["sh", "-c", "true"], pool: "default" } });
    expect((await client.applyAgent({ name: "tmp", command: "false" })).created).toBe(false);
    expect((await client.listAgents()).map((a) => a.name)).toEqual(["echo", "tmp"]);
    expect((await client.getAgent("tmp")).command).toEqual(["sh", "-c", "false"]);
    await client.removeAgent("tmp");
    await expect(client.getAgent("tmp")).rejects.toMatchObject({ code: ErrorCode.notFound });
    await expect(client.applyAgent({ name: "bad name!", command: "" })).rejects.toMatchObject({
      code: ErrorCode.invalid,
      // Relative to the request body, { definition }.
      issues: expect.arrayContaining([
        expect.objectContaining({ path: "definition.name" }),
        expect.objectContaining({ path: "definition.command" }),
      ]),
    });
  });
});

describe("the durable intake subject", () => {
  test("a fire-and-forget submission is admitted; a bad one is recorded as rejected with its reason", async () => {
    const { names } = nats.topology;
    const before = await workStreamMessages();
    await nats.topology.js.publish(
      names.subjects.submit("local", "echo"),
      JSON.stringify({ input: { via: "intake" }, idempotencyKey: "intake-ok" }),
    );
    await nats.topology.js.publish(names.subjects.submit("local", "echo"), "not json at all");
    await nats.topology.js.publish(names.subjects.submit("local", "echo"), JSON.stringify({ input: 1, timeout: -5 }));
    await nats.topology.js.publish(names.subjects.submit("local", "ghost"), JSON.stringify({}));

    const client = createClient(nats.topology);
    const deadline = Date.now() + 10_000;
    let rejected: JobRecord[] = [];
    while (Date.now() < deadline) {
      rejected = (await client.listJobs({ state: "rejected" })).jobs;
      if (rejected.length >= 3) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(rejected.map((j) => j.error?.code).sort()).toEqual([ErrorCode.badJson, ErrorCode.invalid, ErrorCode.unknownAgent]);
    expect(rejected.find((j) => j.error?.code === ErrorCode.invalid)?.error?.issues?.[0]?.path).toBe("timeout");
    expect(rejected.find((j) => j.error?.code === ErrorCode.unknownAgent)?.agent).toBe("ghost");
    const admitted = (await client.listJobs({ agent: "echo" })).jobs.filter((j) => j.spec?.idempotencyKey === "intake-ok");
    expect(admitted).toHaveLength(1);
    expect(admitted[0]?.spec?.input).toEqual({ via: "intake" });
    expect(await workStreamMessages()).toBe(before + 1);
    // Every intake message was acked: nothing is left in the intake work queue.
    expect((await nats.topology.jsm.streams.info(names.streams.submit)).state.messages).toBe(0);
  });
});
