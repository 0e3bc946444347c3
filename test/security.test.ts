import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pushAccount } from "@boxcar/auth";
import { connectNats, resolveConnection } from "@boxcar/client";
import { MAX_OPEN_UPLOADS } from "@boxcar/dispatcher";
import { WorkSigner } from "@boxcar/fabric";
import { type BoxcarEvent, ErrorCode, type JobRecord, PROTOCOL_VERSION, UPLOAD_END_HEADER, type WorkItem } from "@boxcar/protocol";
import { eventually } from "@boxcar/testing";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { Objm } from "@nats-io/obj";
import { headers, type NatsConnection, errors as natsErrors } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { boxcar } from "./helpers/cli.js";
import { type Principal, type SecuredSystem, securedSystem } from "./helpers/secured.js";

const hello = {
  name: "hello",
  command:
    'echo "hi $(cat "$BOXCAR_INPUT_FILE")"; echo out > "$BOXCAR_OUTPUT_DIR/a.txt"; printf \'{"output":{"ok":true}}\' > "$BOXCAR_RESULT_FILE"',
  runtime: { sandbox: "host" },
  trusted: true,
  outputs: ["out/**"],
};

/** True when `err` is NATS refusing a publish or subscription (on its own or as a cause). */
function isDenied(err: unknown): boolean {
  for (let e = err; e; e = (e as Error).cause) {
    if (e instanceof natsErrors.PermissionViolationError) return true;
    if (e instanceof Error && /permissions violation/i.test(e.message)) return true;
  }
  return false;
}

async function expectDenied(what: string, action: () => Promise<unknown>): Promise<void> {
  let error: unknown;
  try {
    await action();
  } catch (err) {
    error = err;
  }
  expect(error, `${what} was not refused`).toBeDefined();
  expect(isDenied(error), `${what}: refused, but not by NATS permissions: ${String(error)}`).toBe(true);
}

/** A subscription NATS refuses ends with a permissions violation instead of delivering. */
async function expectSubscribeDenied(nc: NatsConnection, subject: string, queue?: string): Promise<void> {
  const sub = nc.subscribe(subject, queue ? { queue } : {});
  const ended = (async () => {
    for await (const _ of sub) return "delivered";
    return "closed";
  })().catch((err: unknown) => (isDenied(err) ? "denied" : `failed: ${String(err)}`));
  await nc.flush();
  expect(await Promise.race([ended, new Promise((r) => setTimeout(() => r("still open"), 3_000))]), subject).toBe("denied");
}

describe("a system run with `boxcar auth init`'s config, every role with its own credential", () => {
  let sys: SecuredSystem;
  let admin: Principal;
  let alice: Principal;
  let bob: Principal;
  let viewer: Principal;
  let alicesJob: JobRecord;
  let dir: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "boxcar-security-"));
    sys = await securedSystem();
    admin = await sys.as("admin");
    alice = await sys.as("alice", "submitter");
    bob = await sys.as("bob", "submitter");
    viewer = await sys.as("viewer");
    await admin.client.applyAgent(hello);
    alicesJob = (await alice.client.submit({ agent: "hello", input: "from alice" })).job;
    alicesJob = await alice.client.waitForJob(alicesJob.id);
  }, 60_000);
  afterAll(async () => {
    await sys?.[Symbol.asyncDispose]();
    await rm(dir, { recursive: true, force: true });
  });

  it("a dispatcher's watch of the jobs bucket keeps up under its own credential: many big records are all listed (its flow control is allowed)", async () => {
    // Delayed a day: they stay queued, their records whole (about 250 KB each, 5 MiB in all).
    await admin.client.applyAgent({ ...hello, name: "bulky" });
    const big = "x".repeat(250_000);
    const ids: string[] = [];
    for (let i = 0; i < 20; i++) ids.push((await alice.client.submit({ agent: "bulky", input: { big, i }, delay: "24h" })).job.id);
    const listed = await eventually(async () => {
      const seen = new Set<string>();
      let after: string | undefined;
      do {
        const page = await alice.client.listJobs({ agent: "bulky", limit: 50, ...(after ? { after } : {}) });
        for (const job of page.jobs) seen.add(job.id);
        after = page.next;
      } while (after);
      return seen.size === ids.length ? seen : undefined;
    }, "every big job in the list");
    expect([...listed].sort()).toEqual([...ids].sort());
    for (const id of ids) await alice.client.cancelJob(id);
    // Gone again: the tests after list every job in a page, which 5 MiB of records would not fit.
    expect(await admin.client.cleanJobs({ olderThan: 0, agent: "bulky" })).toMatchObject({ deleted: ids.length });
  }, 60_000);

  it("a submitter runs a job end to end: submit, wait, events, logs, artifacts; the record names its owner", async () => {
    expect(alicesJob.state).toBe("succeeded");
    expect(alicesJob.owner).toBe("alice");
    const events: BoxcarEvent[] = [];
    for await (const e of alice.client.events(alicesJob.id)) events.push(e);
    expect(events.map((e) => e.type)).toContain("succeeded");
    let out = "";
    for await (const chunk of alice.client.logs(alicesJob.id)) out += new TextDecoder().decode(chunk.data);
    expect(out).toContain('hi "from alice"');
    expect(alicesJob.artifacts.map((a) => a.path)).toEqual(["out/a.txt"]);
  });

  it("workflows.list pages and its pool filter on jobs.list show a submitter only its own work", async () => {
    const run = (who: Principal) => who.client.startRun({ workflow: { name: "owned", steps: [{ name: "a", agent: "hello" }] } });
    const bobs = [(await run(bob)).run.id, (await run(bob)).run.id];
    const alices = (await run(alice)).run.id;
    const seen: string[] = [];
    for (let after = "", pages = 0; pages < 10; pages++) {
      const page = await alice.client.listRunsPage({ workflow: "owned", limit: 1, after });
      seen.push(...page.runs.map((r) => r.id));
      if (!page.next) break;
      after = page.next;
    }
    expect(seen).toEqual([alices]);
    expect((await admin.client.listRuns({ workflow: "owned" })).map((r) => r.id).sort()).toEqual([...bobs, alices].sort());
    expect((await bob.client.listJobs({ pool: "default", limit: 1000 })).jobs.map((j) => j.id)).not.toContain(alicesJob.id);
  });

  it("another submitter cannot see, cancel or retry it, and does not find it in the list; an admin and a viewer do", async () => {
    for (const action of [
      () => bob.client.getJob(alicesJob.id),
      () => bob.client.cancelJob(alicesJob.id),
      () => bob.client.retryJob(alicesJob.id),
    ]) {
      await expect(action()).rejects.toMatchObject({ code: ErrorCode.notFound });
    }
    expect((await bob.client.listJobs()).jobs.map((j) => j.id)).not.toContain(alicesJob.id);
    expect((await alice.client.listJobs()).jobs.map((j) => j.id)).toContain(alicesJob.id);
    expect((await admin.client.getJob(alicesJob.id)).id).toBe(alicesJob.id);
    expect((await viewer.client.listJobs()).jobs.map((j) => j.id)).toContain(alicesJob.id);
    // An equal idempotency key of another user is another job.
    const a = await alice.client.submit({ agent: "hello", idempotencyKey: "same-key" });
    const b = await bob.client.submit({ agent: "hello", idempotencyKey: "same-key" });
    expect(b.job.id).not.toBe(a.job.id);
    expect(b.duplicate).toBe(false);
  });

  it("a submitter reads its own events, output and artifacts through the API and live subscriptions, nobody else's", async () => {
    const { names } = bob;
    await expect(alice.client.downloadArtifacts(alicesJob.id, join(dir, "alice"))).resolves.toEqual([join(dir, "alice", "out/a.txt")]);
    expect(await readFile(join(dir, "alice", "out/a.txt"), "utf8")).toBe("out\n");
    for (const action of [
      async () => {
        for await (const _ of bob.client.events(alicesJob.id)) break;
      },
      async () => {
        for await (const _ of bob.client.logs(alicesJob.id)) break;
      },
      () => bob.client.downloadArtifacts(alicesJob.id, join(dir, "bob")),
      () =>
        bob.nc
          .request(
            names.subjects.api({ role: "submitter", user: "bob" }, "jobs.artifact"),
            JSON.stringify({ id: alicesJob.id, path: "out/a.txt" }),
          )
          .then((m) => {
            throw new Error(m.string());
          }),
    ]) {
      await expect(action()).rejects.toMatchObject({ message: expect.stringContaining(alicesJob.id) });
    }
    // The same through the CLI with bob's credential, and his own job works there.
    const asBob = (...args: string[]) => boxcar(sys.url, sys.prefix, args, { NATS_CREDS: bob.creds });
    for (const args of [
      ["status", alicesJob.id],
      ["logs", alicesJob.id],
      ["events", alicesJob.id],
      ["artifacts", alicesJob.id, "--out", dir],
    ]) {
      const r = await asBob(...args);
      expect(r.code, args.join(" ")).toBe(3);
      expect(r.stderr).toContain("not_found");
    }
    expect((await asBob("jobs")).stdout).not.toContain(alicesJob.id);
    await expectSubscribeDenied(bob.nc, names.subjects.ownerEventsOf("job", "alice"));
    await expectSubscribeDenied(bob.nc, names.subjects.jobLogs("alice", alicesJob.id));
    await expectSubscribeDenied(bob.nc, names.subjects.eventsAll);
    // Bob's own job: his SDK follows it live, its output included, with no JetStream access.
    const mine = await bob.client.submit({ agent: "hello", input: "bob's" });
    let out = "";
    for await (const chunk of bob.client.logs(mine.job.id, { follow: true })) out += new TextDecoder().decode(chunk.data);
    expect(out).toContain("bob's");
    expect((await bob.client.waitForJob(mine.job.id)).owner).toBe("bob");
    const types: string[] = [];
    for await (const e of bob.client.events(mine.job.id, { follow: true })) types.push(e.type);
    expect(types.at(-1)).toBe("succeeded");
  });

  it("a submitter uploads input files through the dispatcher, and cannot use or write another's", async () => {
    const copy = { ...hello, name: "cat-input", command: 'cat data.txt; printf \'{"output":null}\' > "$BOXCAR_RESULT_FILE"' };
    await admin.client.applyAgent(copy);
    const file = join(dir, "data.txt");
    // Larger than one chunk, so the upload takes several messages.
    await writeFile(file, `${"x".repeat(300 * 1024)}\nalice's data\n`);
    const { job } = await alice.client.submit({ agent: "cat-input" }, { upload: [{ localPath: file, path: "data.txt" }] });
    const object = job.spec?.files[0]?.object ?? "";
    expect(object.startsWith("inputs/alice/")).toBe(true);
    let out = "";
    for await (const chunk of alice.client.logs(job.id, { follow: true })) out += new TextDecoder().decode(chunk.data);
    expect(out).toContain("alice's data");
    // Bob names alice's upload in his own job: refused, and her file stays.
    await expect(bob.client.submit({ agent: "cat-input", files: [{ path: "data.txt", object }] })).rejects.toMatchObject({
      code: ErrorCode.forbidden,
    });
    // Bob cannot send chunks into an upload of alice's, whatever its token.
    await expectDenied("bob writes into alice's upload", () => bob.nc.request(alice.names.subjects.upload("alice", "0".repeat(32)), "x"));
    // A refused submission removes the file uploaded for it.
    const objects = async () => {
      const list = await (await new Objm(jetstream(admin.nc)).open(alice.names.buckets.artifacts)).list();
      return list.filter((o) => o.name.startsWith("inputs/alice/")).length;
    };
    const stored = async () => (await jetstreamManager(admin.nc)).streams.info(`OBJ_${alice.names.buckets.artifacts}`);
    const before = await objects();
    const bytesBefore = (await stored()).state.bytes;
    await expect(
      alice.client.submit({ agent: "cat-input", timeout: 1 }, { upload: [{ localPath: file, path: "data.txt" }] }),
    ).rejects.toMatchObject({
      code: ErrorCode.invalid,
    });
    expect(await objects()).toBe(before);
    // Its chunks are gone too, not only its name (300 KiB were sent).
    expect((await stored()).state.bytes - bytesBefore).toBeLessThan(10_000);

    // A chunk over 128 KiB, or a size that does not add up, ends the upload with nothing stored.
    const open = async () =>
      JSON.parse(
        (await alice.nc.request(alice.names.subjects.api({ role: "submitter", user: "alice" }, "inputs.upload"), '{"path":"y"}')).string(),
      ).data as { subject: string };
    const big = await alice.nc.request((await open()).subject, new Uint8Array(200 * 1024));
    expect(big.json<{ error: { code: string } }>().error.code).toBe(ErrorCode.tooLarge);
    const short = headers();
    short.set(UPLOAD_END_HEADER, "999");
    const wrong = await alice.nc.request((await open()).subject, "abc", { headers: short, timeout: 5_000 });
    expect(wrong.json<{ error: { code: string; message: string } }>().error).toMatchObject({
      code: ErrorCode.invalid,
      message: "the upload declared 999 bytes and sent 3",
    });
    expect(await objects()).toBe(before);
  });

  it("a submitter's uploads are few at a time; workers show it no job ids; an unreadable record breaks no list", async () => {
    const dave = await sys.as("dave", "submitter");
    const open = () => dave.nc.request(dave.names.subjects.api({ role: "submitter", user: "dave" }, "inputs.upload"), '{"path":"a.txt"}');
    for (let i = 0; i < MAX_OPEN_UPLOADS; i++) expect((await open()).json<{ ok: boolean }>().ok).toBe(true);
    expect((await open()).json<{ error: { code: string } }>().error.code).toBe(ErrorCode.conflict);

    const workers = await dave.client.listWorkers();
    expect(workers.length).toBeGreaterThan(0);
    expect(workers.every((w) => w.jobs.length === 0)).toBe(true);

    await (await new Kvm(jetstream(admin.nc)).open(admin.names.buckets.jobs)).put("0garbage", "not json");
    const listed = await admin.client.listJobs({ limit: 1000 });
    expect(listed.jobs.map((j) => j.id)).toContain(alicesJob.id);
    expect(listed.jobs.map((j) => j.id)).not.toContain("0garbage");
  });

  it("a submitter cannot apply or remove agents, nor make one trusted; a viewer cannot submit or cancel", async () => {
    await expect(alice.client.applyAgent({ ...hello, name: "mine" })).rejects.toMatchObject({ code: ErrorCode.forbidden });
    await expect(alice.client.removeAgent("hello")).rejects.toMatchObject({ code: ErrorCode.forbidden });
    await expect(viewer.client.submit({ agent: "hello" })).rejects.toMatchObject({ code: ErrorCode.forbidden });
    await expect(viewer.client.cancelJob(alicesJob.id)).rejects.toMatchObject({ code: ErrorCode.forbidden });
    expect((await admin.client.getAgent("hello")).command).toEqual(["sh", "-c", hello.command]);
  });

  it("an admin's agent with a key in env is refused at apply, naming the variable and the fix", async () => {
    const err = await admin.client
      .applyAgent({ ...hello, name: "leaky", env: { OPENAI_API_KEY: "sk-live-0123456789abcdefghij" } })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: ErrorCode.invalid });
    expect((err as Error).message).toContain("env.OPENAI_API_KEY looks like a credential");
    expect((err as Error).message).toContain("secrets: [OPENAI_API_KEY]");
    await expect(admin.client.getAgent("leaky")).rejects.toMatchObject({ code: ErrorCode.notFound });
  });

  it("only an admin sends a job or a workflow step to another pool than its agent's", async () => {
    await expect(alice.client.submit({ agent: "hello", pool: "prod" })).rejects.toMatchObject({ code: ErrorCode.forbidden });
    const workflow = { name: "w", steps: [{ name: "a", agent: "hello", pool: "prod" }] };
    await expect(alice.client.startRun({ workflow })).rejects.toMatchObject({ code: ErrorCode.forbidden });
  });

  it("a request whose reply subject is not its caller's inbox is dropped: no answer lands on records, control subjects or another's inbox", async () => {
    const { names } = viewer;
    const jsm = await jetstreamManager(admin.nc);
    const eventsBefore = (await jsm.streams.info(names.streams.events)).state.messages;
    // Subjects a dispatcher may publish to, so an answer aimed there would have landed.
    const targets = [
      `$JS.API.STREAM.PURGE.${names.streams.events}`,
      `$KV.${names.buckets.agents}.hello`,
      `$KV.${names.buckets.jobs}.${alicesJob.id}`,
      `$KV.${names.buckets.idempotency}.0123abcd`,
      `$O.${names.buckets.artifacts}.M.eA`,
      names.subjects.cancel(alicesJob.id),
      names.subjects.event("job", alicesJob.id, "succeeded", "alice"),
      `${names.inboxPrefix("alice")}.stolen`,
    ];
    const landed: string[] = [];
    const watch = admin.nc.subscribe(">", {
      callback: (_e, m) => {
        if (targets.includes(m.subject)) landed.push(m.subject);
      },
    });
    await admin.nc.flush();
    const upload = JSON.parse(
      (await bob.nc.request(names.subjects.api({ role: "submitter", user: "bob" }, "inputs.upload"), '{"path":"x.txt"}')).string(),
    ).data as { subject: string };
    for (const target of targets) {
      for (const [p, role] of [
        [viewer, "viewer"],
        [bob, "submitter"],
      ] as const) {
        p.nc.publish(names.subjects.api({ role, user: p.user }, "agents.list"), "{}", { reply: target });
        p.nc.publish(names.subjects.api({ role, user: p.user }, "jobs.get"), JSON.stringify({ id: alicesJob.id }), { reply: target });
      }
      bob.nc.publish(upload.subject, "chunk", { reply: target });
    }
    await Promise.all([viewer.nc.flush(), bob.nc.flush()]);
    await new Promise((r) => setTimeout(r, 1_000));
    watch.unsubscribe();
    expect(landed).toEqual([]);
    expect((await jsm.streams.info(names.streams.events)).state.messages).toBeGreaterThanOrEqual(eventsBefore);
    expect((await admin.client.getAgent("hello")).name).toBe("hello");
    expect((await admin.client.getJob(alicesJob.id)).state).toBe("succeeded");
  });

  it("a submitter cannot ask as someone else: NATS refuses a request on another user's or role's subject", async () => {
    const { names } = alice;
    for (const caller of [
      { role: "submitter", user: "bob" },
      { role: "admin", user: "alice" },
    ] as const) {
      await expectDenied(`request as ${caller.role} ${caller.user}`, () =>
        alice.nc.request(names.subjects.api(caller, "agents.apply"), JSON.stringify({ definition: hello }), { timeout: 2_000 }),
      );
    }
    await expectDenied("intake as bob", () => alice.nc.request(names.subjects.submit("bob", "hello"), "{}", { timeout: 2_000 }));
  });

  it("every attack of issue 11 fails for a submitter's and a viewer's credential, and the system still runs jobs after", async () => {
    const { names } = alice;
    const { streams, buckets } = names;
    const jsm = await jetstreamManager(admin.nc);
    const stored = async () => (await jsm.streams.info(streams.events)).state.messages;
    const eventsBefore = await stored();
    for (const p of [alice, viewer]) {
      const { nc } = p;
      const send =
        (subject: string, body = "{}", reply?: string) =>
        async () => {
          if (reply === undefined) return nc.request(subject, body, { timeout: 2_000 });
          nc.publish(subject, body, { reply });
          return nc.request(subject, body, { timeout: 2_000 }); // a request to the same subject reports the refusal
        };
      const forged: WorkItem = {
        v: PROTOCOL_VERSION,
        jobId: "forged",
        agent: { ...(await admin.client.getAgent("hello")), command: ["sh", "-c", "touch /tmp/pwned"] },
        input: null,
        files: [],
        timeoutMs: 10_000,
      };
      await expectDenied("publish a work item", send(names.subjects.work("default"), JSON.stringify(forged)));
      const record = JSON.stringify({ ...alicesJob, result: { output: "forged" } });
      await expectDenied("overwrite a job record", send(`$KV.${buckets.jobs}.${alicesJob.id}`, record));
      await expectDenied("publish an event", send(names.subjects.event("job", alicesJob.id, "succeeded", "alice")));
      await expectDenied("purge the events stream", send(`$JS.API.STREAM.PURGE.${streams.events}`));
      await expectDenied("delete the work stream", send(`$JS.API.STREAM.DELETE.${streams.work}`));
      await expectDenied(
        "pull work items off the pool's consumer",
        send(`$JS.API.CONSUMER.MSG.NEXT.${streams.work}.${names.poolConsumer("default")}`),
      );
      await expectDenied(
        "list a stream's subjects (users and job ids)",
        send(`$JS.API.STREAM.INFO.${streams.events}`, '{"subjects_filter":">"}'),
      );
      await expectDenied("make a consumer", send(`$JS.API.CONSUMER.CREATE.${streams.events}`));
      await expectDenied("roll up the artifacts store", send(`$O.${buckets.artifacts}.M.x`));
      // JetStream answers a stored message on the reply subject its publisher names, past the
      // publisher's permissions: so no stream's subject may be published to, with or without one.
      await expectDenied(
        "intake with its publish ack aimed at a purge",
        send(names.subjects.submit(p.user, "hello"), "{}", `$JS.API.STREAM.PURGE.${streams.events}`),
      );
      await expectSubscribeDenied(nc, names.subjects.apiAll);
      await expectSubscribeDenied(nc, names.subjects.workAll);
      await expectSubscribeDenied(nc, names.subjects.apiEndpoint("jobs.submit"), "q");
      await expectSubscribeDenied(nc, "_INBOX.>");
      // Each refused subscription above may close the connection's own subscriptions; reconnect checks below use fresh ones.
    }
    expect(await stored()).toBeGreaterThanOrEqual(eventsBefore);
    // A raw cancel on the control subject: core NATS gives no reply, so watch the server refuse it.
    const refused = (async () => {
      for await (const s of alice.nc.status()) if (s.type === "error" && isDenied(s.error)) return true;
      return false;
    })();
    alice.nc.publish(alice.names.subjects.cancel(alicesJob.id));
    expect(await Promise.race([refused, new Promise((r) => setTimeout(() => r(false), 3_000))])).toBe(true);

    // Unharmed: the record is as it was, and a new job runs.
    expect((await admin.client.getJob(alicesJob.id)).result?.output).toEqual({ ok: true });
    const after = await bob.client.submit({ agent: "hello", input: "after" });
    expect((await bob.client.waitForJob(after.job.id)).state).toBe("succeeded");
  }, 60_000);

  it("a worker's credential cannot publish work items, call the API, delete or purge streams; a dispatcher's may purge only what retention deletes", async () => {
    const worker = await sys.as("worker");
    const dispatcher = await sys.as("dispatcher");
    const { names } = worker;
    await expectDenied("a worker publishes a work item", () => jetstream(worker.nc).publish(names.subjects.work("default"), "{}"));
    await expect(worker.client.listJobs()).rejects.toMatchObject({ code: ErrorCode.forbidden });
    const workerJsm = await jetstreamManager(worker.nc);
    await expectDenied("a worker purges the events stream", () => workerJsm.streams.purge(names.streams.events));
    // A dispatcher deletes an ended job's events, output and record past its retention (by
    // purges filtered on the job), but no queued work, submission, agent or stream.
    const dispatcherJsm = await jetstreamManager(dispatcher.nc);
    for (const stream of [names.streams.work, names.streams.submit, names.streams.dead, `KV_${names.buckets.agents}`]) {
      await expectDenied(`a dispatcher purges ${stream}`, () => dispatcherJsm.streams.purge(stream));
    }
    for (const jsm of [workerJsm, dispatcherJsm]) {
      await expectDenied("a role deletes the work stream", () => jsm.streams.delete(names.streams.work));
      await expectDenied("a role deletes the events stream", () => jsm.streams.delete(names.streams.events));
    }
    // The usage the dispatchers summed: a worker's gateway reads it (budgets that stop a call) and cannot change it.
    const day = new Date().toISOString().slice(0, 10);
    const usageBucket = { ttl: 400 * 24 * 3_600_000, max_bytes: 256 * 1024 * 1024 }; // as the dispatchers make it
    await (await new Kvm(jetstream(admin.nc)).create(names.buckets.usage, usageBucket)).put(
      `${day}.agent.hello`,
      JSON.stringify({ calls: 1, tokensIn: 5, tokensOut: 1, cost: 0, seq: 1 }),
    );
    const workerUsage = await new Kvm(jetstream(worker.nc)).open(names.buckets.usage);
    expect((await workerUsage.get(`${day}.agent.hello`))?.json()).toMatchObject({ tokensIn: 5 });
    await expectDenied("a worker writes the usage bucket", () => workerUsage.put(`${day}.agent.hello`, "{}"));
  });

  it("work items without a trusted dispatcher's signature are terminated unrun, each with a work_rejected event", async () => {
    const { names } = admin;
    const js = jetstream(admin.nc);
    const marker = join(sys.auth.dir, "forged-ran");
    const agent = { ...(await admin.client.getAgent("hello")), command: ["sh", "-c", `touch ${marker}`] };
    const item: WorkItem = { v: PROTOCOL_VERSION, jobId: "0forged0000000000", agent, input: null, files: [], timeoutMs: 10_000 };
    const body = new TextEncoder().encode(JSON.stringify(item));
    const subject = names.subjects.work("default");
    const rejections: string[] = [];
    const sub = admin.nc.subscribe(names.subjects.event("worker", "*", "work_rejected"), {
      callback: (_err, m) => {
        rejections.push(m.json<{ error?: { message: string } }>().error?.message ?? "");
      },
    });
    await admin.nc.flush();
    // With the admin's credential, which may publish anywhere, but no signature...
    await js.publish(subject, body);
    // ...and signed by the admin's own key, which workers do not trust...
    const adminSeed = resolveConnection({ flags: { creds: admin.creds }, env: {} }).seed;
    const hdrs = headers();
    new WorkSigner(adminSeed as Uint8Array).sign(subject, body, hdrs);
    await js.publish(subject, body, { headers: hdrs });
    // ...and a dispatcher's signature over other content.
    const dispatcherSeed = resolveConnection({ flags: { creds: sys.auth.credsFile("dispatcher") }, env: {} }).seed;
    const tampered = headers();
    new WorkSigner(dispatcherSeed as Uint8Array).sign(subject, new TextEncoder().encode("{}"), tampered);
    await js.publish(subject, body, { headers: tampered });

    await eventually(async () => (rejections.length >= 3 ? true : undefined), "three work_rejected events", 15_000);
    sub.unsubscribe();
    expect(rejections[0]).toContain("not signed");
    expect(rejections[1]).toContain("not by a dispatcher this worker trusts");
    expect(rejections[2]).toContain("signature does not match");
    await expect(readFile(marker)).rejects.toThrow();
    const info = await (await jetstreamManager(admin.nc)).streams.info(names.streams.work);
    expect(info.state.messages).toBe(0); // terminated: gone from the work queue
  }, 30_000);

  it("no credential appears in any record, event, log line, log stream or reply", async () => {
    const secrets: string[] = [];
    for (const u of sys.auth.users()) {
      const creds = await readFile(sys.auth.credsFile(u.name), "utf8").catch(() => "");
      const jwt = /-----BEGIN NATS USER JWT-----\s*(\S+)/.exec(creds)?.[1];
      const seed = /(SU[A-Z2-7]{56})/.exec(creds)?.[1];
      if (jwt) secrets.push(jwt);
      if (seed) secrets.push(seed);
    }
    expect(secrets.length).toBeGreaterThanOrEqual(10);
    const everything: string[] = [...sys.logLines];
    const jsm = await jetstreamManager(admin.nc);
    for await (const stream of jsm.streams.list()) {
      const count = stream.state.messages;
      for (let seq = stream.state.first_seq; count > 0 && seq <= stream.state.last_seq; seq++) {
        const msg = await jsm.streams.getMessage(stream.config.name, { seq }).catch(() => undefined);
        if (msg)
          everything.push(
            new TextDecoder().decode(msg.data),
            JSON.stringify(msg.header ? [...msg.header.keys()].map((k) => msg.header?.get(k)) : []),
          );
      }
    }
    expect(everything.length).toBeGreaterThan(20);
    const text = everything.join("\n");
    for (const secret of secrets) expect(text.includes(secret), "a credential leaked").toBe(false);
  }, 60_000);

  it("revoking a user cuts it off within seconds, with nothing restarted", async () => {
    const carol = await sys.as("carol", "submitter");
    expect((await carol.client.listJobs()).jobs).toEqual([]);
    const statuses: string[] = [];
    void (async () => {
      for await (const st of carol.nc.status()) statuses.push(`${st.type} ${"error" in st ? String(st.error) : ""}`);
    })();
    const revokedAt = Date.now();
    await sys.auth.revoke("carol");
    await pushAccount(sys.auth, [sys.url]);
    await eventually(async () => (statuses.some((st) => st.startsWith("disconnect")) ? true : undefined), "carol disconnected", 10_000);
    expect(Date.now() - revokedAt).toBeLessThan(10_000);
    await expect(
      connectNats(resolveConnection({ flags: { nats: sys.url, creds: carol.creds }, env: {} }), "carol-again"),
    ).rejects.toMatchObject({ code: ErrorCode.unavailable });
    // Others are unaffected.
    expect((await bob.client.listJobs()).jobs.length).toBeGreaterThan(0);
  }, 30_000);
});
