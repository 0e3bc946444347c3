import { createHash } from "node:crypto";
import { type AddressInfo, createServer } from "node:net";
import { readStream } from "@boxcar/fabric/internal";
import { API_CONTRACT, type ApiEndpoint, type ApiReplyData, apiSchemaFile, jsonSchemas } from "@boxcar/protocol";
import { eventually, localSystem } from "@boxcar/testing";
import { Svcm } from "@nats-io/services";
import { Ajv2020 } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { expect, test } from "vitest";

/**
 * The published JSON Schemas of what Boxcar stores and sends (schemas/*.schema.json) hold for
 * what a real system writes: a client in another language can validate against them.
 */
test("records, work items, events, worker entries and workflow runs a real system writes match their published JSON Schemas", async () => {
  await using system = await localSystem();
  const { client, nats, worker } = system;
  const { topology } = nats;
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats.default(ajv);
  const schemas = jsonSchemas();
  const check = (file: string, value: unknown, what: string) => {
    const validate = ajv.compile(schemas[file] as object);
    expect(validate(value) ? [] : validate.errors, `${what} against ${file}`).toEqual([]);
  };

  await client.applyAgent({
    name: "echo",
    command: [
      "bash",
      "-c",
      'echo hi > out/note.txt; printf \'{"output":%s,"summary":"ok"}\' "$(cat "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"',
    ],
    trusted: true,
    runtime: { sandbox: "host", timeout: "30s" },
  });
  await client.applyAgent({ name: "fails", command: ["bash", "-c", "exit 3"], trusted: true, runtime: { sandbox: "host" } });
  // A pool no worker serves: its job's work item stays in the stream to be read.
  await client.applyAgent({ name: "waits", command: "true", trusted: true, pool: "nobody", runtime: { sandbox: "host" } });

  const ok = await client.waitForJob((await client.submit({ agent: "echo", input: { n: 1 } })).job.id);
  const failed = await client.waitForJob((await client.submit({ agent: "fails" })).job.id);
  const waiting = (await client.submit({ agent: "waits", input: { big: "x".repeat(1000) } })).job;
  const { run } = await client.startRun({
    workflow: {
      name: "pair",
      steps: [
        { name: "a", agent: "echo" },
        { name: "b", agent: "echo", needs: ["a"], input: "{{ steps.a.output }}" },
      ],
    },
    input: 5,
  });
  const ended = await client.waitForRun(run.id);
  expect([ok.state, failed.state, ended.state]).toEqual(["succeeded", "failed", "succeeded"]);

  for (const id of [ok.id, failed.id, waiting.id]) check("job-record.schema.json", (await topology.jobs.get(id))?.json(), `job ${id}`);
  const item = await topology.jsm.streams.getMessage(topology.names.streams.work, {
    last_by_subj: topology.names.subjects.work(waiting.pool, waiting.priority),
  });
  check("work-item.schema.json", item?.json(), "a work item");
  let events = 0;
  for await (const msg of readStream(topology, topology.names.streams.events, `${topology.names.prefix}.evt.>`)) {
    check("event.schema.json", msg.json(), msg.subject);
    events += 1;
  }
  expect(events).toBeGreaterThan(10);
  check("worker.schema.json", (await topology.workers.get(worker.id))?.json(), "the worker's presence");
  check("workflow-run.schema.json", (await topology.workflows.get(run.id))?.json(), "the workflow run");

  // And they are not so loose that anything passes.
  const validate = ajv.compile(schemas["job-record.schema.json"] as object);
  expect(validate({ ...(await topology.jobs.get(ok.id))?.json<object>(), state: "finished" })).toBe(false);
});

/**
 * Every endpoint's published contract (schemas/api/<endpoint>.schema.json) holds for what a real
 * dispatcher takes and answers, and `$SRV.INFO` names it for each endpoint.
 */
test("each API request and the data of its reply match the endpoint's published JSON Schema; $SRV.INFO names it", async () => {
  await using system = await localSystem();
  const { nats } = system;
  const { nc, names } = nats.topology;
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats.default(ajv);
  const schemas = jsonSchemas();
  const validator = (endpoint: ApiEndpoint, side: "request" | "reply") =>
    ajv.compile({ ...(schemas[apiSchemaFile(endpoint)] as object), $ref: `#/$defs/${side}` });
  const called = new Set<string>();
  /** Sends `body` as admin.local, checks both sides against the endpoint's schema, returns the reply's data. */
  const call = async <E extends ApiEndpoint>(endpoint: E, body: object): Promise<ApiReplyData<E>> => {
    const request = validator(endpoint, "request");
    expect(request(body) ? [] : request.errors, `${endpoint} request`).toEqual([]);
    const msg = await nc.request(names.subjects.api({ role: "admin", user: "local" }, endpoint), JSON.stringify(body), { timeout: 10_000 });
    const reply = msg.json<{ ok: boolean; data?: unknown; error?: unknown }>();
    expect(reply, endpoint).toMatchObject({ ok: true });
    const data = validator(endpoint, "reply");
    expect(data(reply.data) ? [] : data.errors, `${endpoint} reply`).toEqual([]);
    called.add(endpoint);
    return reply.data as ApiReplyData<E>;
  };

  const echo = {
    name: "echo",
    command: 'echo hi > out/note.txt; printf \'{"output":%s}\' "$(cat "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"',
    trusted: true,
    sessions: true,
    runtime: { sandbox: "host" as const },
  };
  await call("agents.apply", { definition: echo });
  await call("agents.apply", {
    definition: { name: "waits", command: "true", trusted: true, pool: "nobody", runtime: { sandbox: "host" } },
  });
  await call("agents.get", { name: "echo" });
  await call("agents.list", {});
  const { job } = await call("jobs.submit", { agent: "echo", input: { n: 1 }, idempotencyKey: "wire-1", labels: { from: "wire" } });
  await system.client.waitForJob(job.id);
  await call("jobs.get", { id: job.id });
  await call("jobs.list", { agent: "echo", limit: 10 });
  await call("jobs.count", {});
  await call("jobs.events", { id: job.id });
  await call("jobs.logs", { id: job.id });
  await call("jobs.artifact", { id: job.id, path: "out/note.txt" });
  const waiting = (await call("jobs.submit", { agent: "waits" })).job;
  await call("jobs.cancel", { id: waiting.id });
  await call("jobs.clean", { olderThan: "1h" });
  await call("workers.list", {});
  const { run } = await call("workflows.start", { workflow: { name: "one", steps: [{ name: "a", agent: "echo" }] }, input: 2 });
  await system.client.waitForRun(run.id);
  await call("workflows.get", { id: run.id });
  await call("workflows.list", {});
  await call("workflows.events", { id: run.id });
  const late = (await call("workflows.start", { workflow: { name: "late", steps: [{ name: "a", agent: "waits" }] } })).run;
  await call("workflows.cancel", { id: late.id });
  const gate = (await call("workflows.start", { workflow: { name: "gate", steps: [{ name: "ok", approval: { timeout: "1h" } }] } })).run;
  await call("workflows.approve", { id: gate.id, step: "ok", decision: "approve", comment: "fine" });
  await call("inputs.upload", { path: "data.txt" });
  const { policy } = await call("policy.get", {});
  await call("policy.set", { policy });
  const { session } = await call("sessions.open", { agent: "echo" });
  await call("sessions.exec", { id: session.id, argv: ["sh", "-c", "cat > got.txt"], stdin: Buffer.from("hi").toString("base64") });
  await call("sessions.files.write", { id: session.id, path: "dir/note.txt", data: Buffer.from("note").toString("base64") });
  await call("sessions.files.read", { id: session.id, path: "got.txt" });
  // A file in parts, checked by its SHA-256; read by a range; its size and hash; a watch of its folder.
  const { watch } = await call("sessions.watch", { id: session.id, path: "dir", timeout: "1m" });
  await call("sessions.files.write", {
    id: session.id,
    path: "dir/big.txt",
    data: Buffer.from("part one ").toString("base64"),
    offset: 0,
    size: 17,
  });
  const whole = createHash("sha256").update("part one part two").digest("hex");
  const part = { data: Buffer.from("part two").toString("base64"), offset: 9, size: 17, sha256: whole };
  await call("sessions.files.write", { id: session.id, path: "dir/big.txt", ...part });
  await call("sessions.files.read", { id: session.id, path: "dir/big.txt", offset: 5, length: 8 });
  await call("sessions.files.stat", { id: session.id, path: "dir/big.txt", sha256: true });
  await call("sessions.unwatch", { id: session.id, watchId: watch.watchId });
  // A connection to a port of the session's loopback (a host session's is this machine's).
  const listening = createServer((c) => c.end("hi"));
  await new Promise<void>((r) => listening.listen(0, "127.0.0.1", r));
  const port = (listening.address() as AddressInfo).port;
  await call("sessions.connect", { id: session.id, port, tunnel: "wire-schemas-1" });
  listening.close();
  // A shell on a terminal (through a tunnel of the caller's, nobody on it here: it exits, and its tunnel goes silent).
  await call("sessions.shell", { id: session.id, tunnel: "wire-schemas-2", cols: 80, rows: 24, argv: ["true"] });
  // Pausing is built for Docker sessions (test/session-pause.test.ts checks its replies against
  // these schemas): a host session's requests are checked here, and refused, saying why.
  for (const [endpoint, body] of [
    ["sessions.pause", { id: session.id, timeout: "1m" }],
    ["sessions.resume", { id: session.id }],
  ] as const) {
    const request = validator(endpoint, "request");
    expect(request(body) ? [] : request.errors, `${endpoint} request`).toEqual([]);
    const msg = await nc.request(names.subjects.api({ role: "admin", user: "local" }, endpoint), JSON.stringify(body), { timeout: 10_000 });
    expect(msg.json(), endpoint).toMatchObject({ ok: false, error: { code: endpoint === "sessions.pause" ? "invalid" : "conflict" } });
    called.add(endpoint);
  }
  await call("sessions.files.list", { id: session.id, path: "dir" });
  await call("sessions.files.remove", { id: session.id, path: "dir" });
  const { snapshot } = await call("sessions.snapshot", { id: session.id });
  await call("snapshots.list", {});
  const resumed = (await call("sessions.open", { from: snapshot.id })).session;
  await call("sessions.close", { id: (await call("sessions.open", { agent: "echo", artifactsOf: job.id })).session.id });
  await call("sessions.close", { id: resumed.id });
  await call("snapshots.remove", { id: snapshot.id });
  // A command to cancel, once it has started.
  const started = nc.subscribe(names.subjects.event("session", session.id, "exec_started", "local"), { max: 1 });
  const slow = call("sessions.exec", { id: session.id, argv: ["sleep", "30"], cwd: "." });
  for await (const _ of started) break;
  await call("sessions.cancel", { id: session.id });
  expect((await slow).cancelled).toBe(true);
  // A process in the background, and a command whose whole output is kept (past the 4 MiB live window).
  const { process } = await call("sessions.start", { id: session.id, argv: ["sleep", "30"] });
  await call("sessions.processes", { id: session.id });
  await call("sessions.wait", { id: session.id, execId: process.execId, timeout: 0 });
  await call("sessions.kill", { id: session.id, execId: process.execId });
  const fed = (await call("sessions.start", { id: session.id, argv: ["cat"], openStdin: true })).process;
  await call("sessions.input", { id: session.id, execId: fed.execId, data: Buffer.from("hi").toString("base64"), close: true });
  const big = await call("sessions.exec", { id: session.id, argv: ["sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' a"] });
  await call("sessions.output", { id: session.id, execId: big.execId, offset: 4_500_000, length: 1000 });
  await call("sessions.get", { id: session.id });
  await call("sessions.list", {});
  await call("sessions.events", { id: session.id });
  await call("sessions.logs", { id: session.id });
  await call("sessions.close", { id: session.id });
  await call("schedules.create", { definition: { name: "nightly", cron: "0 2 * * *", timezone: "Europe/Paris", job: { agent: "echo" } } });
  await call("schedules.update", { definition: { name: "nightly", cron: "0 3 * * *", job: { agent: "echo" } } });
  await call("schedules.get", { name: "nightly" });
  await call("schedules.list", {});
  await call("schedules.pause", { name: "nightly" });
  await call("schedules.resume", { name: "nightly" });
  await call("schedules.delete", { name: "nightly" });
  await call("usage.get", {});
  await call("agents.apply", { definition: { name: "sleeper", command: "sleep 20", trusted: true, runtime: { sandbox: "host" } } });
  const sleeping = (await call("jobs.submit", { agent: "sleeper" })).job;
  await eventually(async () => ((await system.client.getJob(sleeping.id)).state === "running" ? true : undefined), "the sleeper to run");
  await call("jobs.signal", { id: sleeping.id, name: "wake", payload: { now: true } });
  await system.client.cancelJob(sleeping.id);
  const sleepy = (await call("workflows.start", { workflow: { name: "sleepy", steps: [{ name: "z", agent: "sleeper" }] } })).run;
  await eventually(async () => {
    const job = (await system.client.getRun(sleepy.id)).steps.z?.instances[0]?.jobs[0];
    return job && (await system.client.getJob(job)).state === "running" ? true : undefined;
  }, "the run's job to run");
  await call("workflows.signal", { id: sleepy.id, name: "wake" });
  await system.client.cancelRun(sleepy.id);
  await call("agents.remove", { name: "waits" });
  // Not so loose that anything passes.
  expect([validator("jobs.get", "reply")({}), validator("jobs.submit", "request")({ agent: 5 })]).toEqual([false, false]);
  // A re-run of an ended job, with a new input; and a retry of a cancelled one.
  await call("jobs.rerun", { id: sleeping.id, input: { again: true } });
  await call("jobs.retry", { id: sleeping.id });
  await system.client.cancelJob(sleeping.id);
  expect(Object.keys(API_CONTRACT).filter((e) => !called.has(e))).toEqual([]);

  // Each endpoint's $SRV.INFO entry carries its request's schema and names the whole contract.
  const [info] = await (await new Svcm(nc).client()).info(names.serviceName).then(async (it) => {
    const all = [];
    for await (const i of it) all.push(i);
    return all;
  });
  expect(info?.endpoints).toHaveLength(Object.keys(API_CONTRACT).length);
  for (const endpoint of info?.endpoints ?? []) {
    const name = endpoint.name.replaceAll("-", ".") as ApiEndpoint;
    expect(endpoint.metadata?.["boxcar.schema"], name).toBe(`schemas/${apiSchemaFile(name)}`);
    const inline = JSON.parse(endpoint.metadata?.["boxcar.request.schema"] ?? "null");
    expect(ajv.compile(inline)({}), `${name}: an empty request`).toBe(
      ajv.compile({ ...(schemas[apiSchemaFile(name)] as object), $ref: "#/$defs/request" })({}),
    );
  }
});
