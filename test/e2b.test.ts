import { createHash, randomBytes } from "node:crypto";
import { readFile, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { join } from "node:path";
import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { AgentDefinitionInput, BoxcarEvent, JobRecord, RuntimeWishes, SandboxEvent } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture, scratch } from "@boxcar/testing";
import {
  AttemptLease,
  createE2BSandboxProvider,
  createWorker,
  type E2BSandboxOptions,
  type SandboxProvider,
  type SandboxSpec,
  type Worker,
  workerOptionsFromConfig,
} from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type E2BStandIn, type StandInSandbox, startE2BStandIn } from "./e2b-standin/index.js";
import { startModelStandIn } from "./helpers/model-standin.js";

const SECRET = `s3cr3t-${randomBytes(8).toString("hex")}`;
const WRONG_KEY = `e2b_wrong_${randomBytes(12).toString("hex")}`;
const MIB = 1024 * 1024;

let nats: NatsFixture;
let standin: E2BStandIn;
let dispatcher: Dispatcher;
let worker: Worker;
let badKeyWorker: Worker;
let client: BoxcarClient;

/** Options pointing the real SDK at the stand-in. */
const standinOptions = (extra: E2BSandboxOptions = {}): E2BSandboxOptions => ({
  apiKey: standin.apiKey,
  apiUrl: standin.apiUrl,
  sandboxUrl: standin.sandboxUrl,
  prefix: nats.topology.names.prefix,
  ...extra,
});

/** The stand-in's sandbox for a job (its metadata names the job). */
function sandboxOf(jobId: string): StandInSandbox | undefined {
  return standin.sandboxes().find((s) => s.metadata.boxcarJob === jobId);
}

describe("E2B sandboxes (the real e2b SDK against the local stand-in)", () => {
  beforeAll(async () => {
    nats = await natsFixture();
    standin = await startE2BStandIn({ templates: { base: { cpuCount: 2, memoryMB: 512 }, big: { cpuCount: 4, memoryMB: 2048 } } });
    dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    worker = createWorker({
      ...nats.workerRole,
      concurrency: 4,
      secretsEnv: { AGENT_TOKEN: SECRET },
      providers: [createE2BSandboxProvider(standinOptions())],
    });
    void worker.run();
    badKeyWorker = createWorker({
      ...nats.workerRole,
      pools: ["badkey"],
      providers: [createE2BSandboxProvider(standinOptions({ apiKey: WRONG_KEY }))],
    });
    void badKeyWorker.run();
    client = createClient(nats.topology);
  });
  afterAll(async () => {
    await badKeyWorker?.close();
    await worker?.close();
    await dispatcher?.close();
    await standin?.close();
    await nats?.[Symbol.asyncDispose]();
  });

  /** Applies an e2b agent running `script` with bash, and runs one job to its end. */
  async function run(name: string, script: string, extra: Partial<AgentDefinitionInput> = {}) {
    const { runtime, ...rest } = extra;
    await client.applyAgent({
      name,
      command: ["bash", "-c", script],
      runtime: { sandbox: "e2b", timeout: "60s", ...runtime },
      ...rest,
    });
    const { job } = await client.submit({ agent: name });
    return finish(job.id);
  }

  async function finish(jobId: string) {
    const final = await client.waitForJob(jobId);
    const events: BoxcarEvent[] = [];
    for await (const e of client.events(jobId)) events.push(e);
    let logs = "";
    for await (const chunk of client.logs(jobId)) logs += new TextDecoder().decode(chunk.data);
    const sandboxEvents = events.filter((e): e is SandboxEvent => e.kind === "sandbox");
    return { final, events, logs, sandboxEvents, types: sandboxEvents.map((e) => e.type) };
  }

  const output = (job: JobRecord) => job.result?.output as Record<string, unknown>;
  const FULL_RUN = ["creating", "ready", "exec_started", "exec_exited", "destroyed"];

  test("a job runs with input files in and artifacts out byte-exact; its sandbox is named, limited to its time, and killed", async () => {
    const data = randomBytes(300 * 1024);
    const notes = "notes with ünïcode\n";
    await using folder = await scratch("boxcar-e2b-");
    const dir = folder.path;
    await writeFile(join(dir, "data.bin"), data);
    await writeFile(join(dir, "notes.txt"), notes);
    await client.applyAgent({
      name: "copy",
      command: [
        "bash",
        "-c",
        'mkdir -p out/sub && cp data.bin out/copy.bin && cp in/notes.txt out/sub/ && printf \'{"output":{"sum":"%s","pwd":"%s"}}\' "$(sha256sum data.bin | cut -c1-64)" "$PWD" > "$BOXCAR_RESULT_FILE"',
      ],
      runtime: { sandbox: "e2b" },
    });
    const upload = [
      { localPath: join(dir, "data.bin"), path: "data.bin" },
      { localPath: join(dir, "notes.txt"), path: "in/notes.txt" },
    ];
    const { job } = await client.submit({ agent: "copy" }, { upload });
    const { final, sandboxEvents, types } = await finish(job.id);

    expect(final.state).toBe("succeeded");
    expect(final.sandbox?.kind).toBe("e2b");
    const remote = sandboxOf(job.id);
    expect(output(final)).toEqual({ sum: createHash("sha256").update(data).digest("hex"), pwd: `${remote?.home}/workspace` });
    expect(final.artifacts.map((a) => a.path)).toEqual(["out/copy.bin", "out/sub/notes.txt"]);
    const copy = await nats.topology.artifacts.getBlob(`${job.id}/out/copy.bin`);
    expect(Buffer.from(copy ?? []).equals(data)).toBe(true);
    expect(Buffer.from((await nats.topology.artifacts.getBlob(`${job.id}/out/sub/notes.txt`)) ?? []).toString()).toBe(notes);

    expect(types).toEqual(FULL_RUN);
    expect(sandboxEvents.find((e) => e.type === "ready")).toMatchObject({
      backend: "e2b",
      image: "base",
      network: "none",
      limits: { cpus: 2, memory: 512 * MIB },
    });
    expect(remote?.metadata).toEqual({
      boxcarPrefix: nats.topology.names.prefix,
      boxcarJob: job.id,
      boxcarAttempt: "1",
      boxcarWorker: final.workerId,
      boxcarSandbox: final.sandbox?.id,
    });
    expect(remote?.allowInternetAccess).toBe(false);
    // The job's default 10 minute limit plus the 5 minute margin, set at creation; when the agent
    // starts, what is left until its lease's stop time (at most 25 s of the pool's 30 s lease, in
    // whole seconds), pushed on at each renewal; once the agent ended, the limit and margin again.
    const [created, atStart, afterAgent] = remote?.timeouts ?? [];
    expect([created, afterAgent, remote?.timeouts.length]).toEqual([900, 900, 3]);
    expect(atStart).toBeGreaterThanOrEqual(15);
    expect(atStart).toBeLessThanOrEqual(25);
    expect(remote?.state).toBe("killed");
    expect(remote?.killedBy).toBe("request");
    expect(await remote?.alive()).toEqual([]);
  });

  test("the agent gets exactly its environment", async () => {
    await client.applyAgent({
      name: "printenv",
      command: ["env"],
      env: { GREETING: "hello 'quoted' $world" },
      runtime: { sandbox: "e2b" },
    });
    const { job } = await client.submit({ agent: "printenv" });
    const { final, logs } = await finish(job.id);
    expect(final.state).toBe("succeeded");
    const env = Object.fromEntries(
      logs
        .trim()
        .split("\n")
        .map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]),
    );
    const workspace = `${sandboxOf(job.id)?.home}/workspace`;
    expect(Object.keys(env).sort()).toEqual(
      [
        "PATH",
        "HOME",
        "LANG",
        "TMPDIR",
        "GREETING",
        "BOXCAR_JOB_ID",
        "BOXCAR_ATTEMPT",
        "BOXCAR_AGENT",
        "BOXCAR_WORKSPACE",
        "BOXCAR_INPUT_FILE",
        "BOXCAR_RESULT_FILE",
        "BOXCAR_USAGE_FILE",
        "BOXCAR_SIGNALS_DIR",
        "BOXCAR_CHAIN_FILE",
        "BOXCAR_OUTPUT_DIR",
        "BOXCAR_STOP_AT",
      ].sort(),
    );
    expect(env).toMatchObject({
      PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      HOME: workspace,
      GREETING: "hello 'quoted' $world",
      BOXCAR_JOB_ID: job.id,
      BOXCAR_WORKSPACE: workspace,
      BOXCAR_RESULT_FILE: `${workspace}/.boxcar/result.json`,
    });
  });

  test("secrets reach the agent but never events, logs or the record; neither does the E2B API key", async () => {
    const { final, events, logs } = await run(
      "secretive",
      'echo "working with $TOKEN"; printf \'{"output":"%s"}\' "$(printf %s "$TOKEN" | sha256sum | cut -c1-64)" > "$BOXCAR_RESULT_FILE"',
      { secrets: [{ name: "TOKEN", from: "AGENT_TOKEN" }] },
    );
    expect(final.result?.output).toBe(createHash("sha256").update(SECRET).digest("hex"));
    expect(logs).toContain("working with [redacted]");
    // Nor is it in any process-start request, which E2B's daemon logs.
    const started = JSON.stringify(sandboxOf(final.id)?.started);
    expect(started).toContain("bash");
    expect(started).not.toContain(SECRET);
    for (const text of [JSON.stringify(events), logs, JSON.stringify(final)]) {
      expect(text).not.toContain(SECRET);
      expect(text).not.toContain(standin.apiKey);
    }
  });

  test("a failing agent: its exit code, its output, the full sandbox sequence, and its sandbox killed", async () => {
    const { final, logs, sandboxEvents, types } = await run("failing", "echo about to fail; echo oops >&2; exit 3");
    expect(final.state).toBe("failed");
    expect(final.error).toEqual({ code: "agent_failed", message: "agent exited with code 3" });
    expect(logs).toContain("about to fail");
    expect(logs).toContain("oops");
    expect(types).toEqual(FULL_RUN);
    expect(sandboxEvents.find((e) => e.type === "exec_exited")).toMatchObject({ exitCode: 3, signal: null });
    expect(sandboxOf(final.id)?.killedBy).toBe("request");
  });

  test("a timed-out agent is killed with what it started, and its sandbox too", async () => {
    const { final, logs, sandboxEvents, types } = await run("sleeper", 'sleep 300 & echo "child $!"; wait', { runtime: { timeout: "2s" } });
    expect(final.state).toBe("timed_out");
    expect(types).toEqual(FULL_RUN);
    expect(sandboxEvents.find((e) => e.type === "exec_exited")).toMatchObject({ exitCode: null, signal: "SIGKILL" });
    const child = Number(/child (\d+)/.exec(logs)?.[1]);
    expect(child).toBeGreaterThan(0);
    expect(await isAlive(child)).toBe(false);
    const remote = sandboxOf(final.id);
    expect(remote?.killedBy).toBe("request");
    expect(await remote?.alive()).toEqual([]);
  });

  test("a cancelled agent is killed and its sandbox too", async () => {
    await client.applyAgent({ name: "waiter", command: ["bash", "-c", "echo up; sleep 300"], runtime: { sandbox: "e2b" } });
    const { job } = await client.submit({ agent: "waiter" });
    await eventually(async () => ((sandboxOf(job.id)?.processes.size ?? 0) > 0 ? true : undefined), "the agent to run");
    await client.cancelJob(job.id);
    const { final, sandboxEvents, types } = await finish(job.id);
    expect(final.state).toBe("cancelled");
    expect(types).toEqual(FULL_RUN);
    expect(sandboxEvents.find((e) => e.type === "exec_exited")).toMatchObject({ exitCode: null, signal: "SIGKILL" });
    const remote = sandboxOf(job.id);
    expect(remote?.killedBy).toBe("request");
    expect(await remote?.alive()).toEqual([]);
  });

  test("a wrong API key fails the job clearly, naming the cause but never the key", async () => {
    const { final, events, logs, types } = await run("badkey", "echo should-not-run", { pool: "badkey" });
    expect(final.state).toBe("failed");
    expect(final.error?.code).toBe("sandbox_failed");
    expect(final.error?.message).toContain("E2B refused the worker's API key (401)");
    expect(final.error?.message).toContain("E2B_API_KEY");
    expect(types).toEqual(["creating", "failed"]);
    expect(sandboxOf(final.id)).toBeUndefined();
    for (const text of [JSON.stringify(events), logs, JSON.stringify(final)]) expect(text).not.toContain(WRONG_KEY);
  });

  test("a missing template fails with image_unavailable naming it", async () => {
    const { final, types } = await run("notemplate", "echo should-not-run", { runtime: { template: "no-such-template" } });
    expect(final.state).toBe("failed");
    expect(final.error?.code).toBe("image_unavailable");
    expect(final.error?.message).toContain("no-such-template");
    expect(final.error?.message).toContain("404");
    expect(types).toEqual(["creating", "failed"]);
  });

  describe("runtime wishes", () => {
    test.each([
      ["a named network", { network: "my-net" }, "my-net"],
      ["a process limit", { limits: { pids: 64 } }, "pids"],
      ["fewer CPUs than the template has", { limits: { cpus: 1 } }, "template base gives its sandboxes 2 CPUs"],
      ["less memory than the template has", { limits: { memory: "256Mi" } }, "memory"],
    ])("E2B cannot honour %s: refused as invalid, nothing left running", async (_what, runtime, mentions) => {
      const { final, types } = await run(`wish-${mentions.replace(/[^a-z]/g, "").slice(0, 20)}`, "echo should-not-run", { runtime });
      expect(final.state).toBe("failed");
      expect(final.error?.code).toBe("invalid");
      expect(final.error?.message).toContain(mentions);
      expect(types).toEqual(["creating", "failed"]);
      expect(sandboxOf(final.id)?.state ?? "killed").toBe("killed");
    });

    test("network bridge turns E2B's internet access on; limits at or above the template's hold", async () => {
      const { final, sandboxEvents } = await run("online", "echo hi", {
        runtime: { network: "bridge", template: "big", limits: { cpus: 4, memory: "4Gi" } },
      });
      expect(final.state).toBe("succeeded");
      expect(sandboxOf(final.id)?.allowInternetAccess).toBe(true);
      expect(sandboxEvents.find((e) => e.type === "ready")).toMatchObject({
        image: "big",
        network: "bridge",
        limits: { cpus: 4, memory: 2048 * MIB },
      });
    });
  });

  test("an agent calls its models through its worker's gateway at the gateway's public address, the one host its sandbox may reach", async () => {
    await using models = await startModelStandIn();
    const port = await closedPort();
    const publicUrl = `http://127.0.0.1:${port}`;
    await using modelWorker = createWorker({
      ...nats.workerRole,
      pools: ["models"],
      providers: [createE2BSandboxProvider(standinOptions())],
      modelGateway: { providers: { openai: { key: "sk-e2b-test-provider-key", baseUrl: models.openaiUrl } }, port, publicUrl },
    });
    void modelWorker.run();
    // The agent calls OpenAI's API as its SDK would, from its variables alone.
    const call = `fetch(process.env.OPENAI_BASE_URL + "/chat/completions", { method: "POST", headers: { authorization: "Bearer " + process.env.OPENAI_API_KEY, "content-type": "application/json" }, body: JSON.stringify({ model: "gpt-test", messages: [{ role: "user", content: "hi from E2B" }] }) }).then((r) => r.json()).then((a) => require("node:fs").writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: { text: a.choices[0].message.content, base: process.env.OPENAI_BASE_URL, keys: Object.values(process.env).filter((v) => v.includes("provider" + "-key")).length } })))`;
    const { final, events } = await run("e2b-models", 'node -e "$CALL"', {
      pool: "models",
      models: { providers: ["openai"] },
      env: { CALL: call },
    });
    expect(final.state, JSON.stringify(final.error)).toBe("succeeded");
    expect(output(final)).toMatchObject({ base: `${publicUrl}/openai/v1`, keys: 0 });
    expect(typeof output(final).text).toBe("string");
    expect(models.requests).toHaveLength(1);
    expect(models.requests[0]?.headers.authorization).toBe("Bearer sk-e2b-test-provider-key");
    expect(events.filter((e) => e.kind === "job" && e.type === "model_call").map((e) => e.kind === "job" && e.call?.status)).toEqual([200]);
    // No internet, but the gateway's host.
    const remote = sandboxOf(final.id);
    expect(remote?.network).toEqual({ denyOut: ["0.0.0.0/0"], allowOut: ["127.0.0.1"] });
    expect(remote?.allowInternetAccess).toBeUndefined();
  }, 60_000);

  test("a prompt agent's tool calls run in its E2B sandbox; its model calls are the worker's own, so no public address is needed", async () => {
    await using models = await startModelStandIn();
    await using promptWorker = createWorker({
      ...nats.workerRole,
      pools: ["prompts"],
      providers: [createE2BSandboxProvider(standinOptions())],
      modelGateway: { providers: { anthropic: { key: "sk-e2b-test-provider-key", baseUrl: models.anthropicUrl } } },
    });
    void promptWorker.run();
    await client.applyAgent({
      name: "e2b-prompt",
      prompt: { model: "anthropic/claude-test", template: "Compute.", tools: ["bash"] },
      runtime: { sandbox: "e2b", timeout: "60s" },
      pool: "prompts",
    });
    models.script(
      { kind: "answer", tool: "bash", input: { command: "echo computed $((6 * 7)) in $PWD" }, id: "e1" },
      { kind: "answer", text: "42" },
    );
    const { job } = await client.submit({ agent: "e2b-prompt" });
    const { final } = await finish(job.id);
    expect(final.state, JSON.stringify(final.error)).toBe("succeeded");
    expect(output(final)).toMatchObject({ text: "42", steps: 2 });
    const remote = sandboxOf(job.id);
    const sent = JSON.stringify(models.requests[1]?.body.messages);
    expect(sent).toContain(`computed 42 in ${remote?.home}/workspace`);
    // The sandbox keeps its network closed: no egress rule was needed.
    expect(remote?.network).toBeUndefined();
    expect(remote?.allowInternetAccess).toBe(false);
  }, 60_000);

  test("the reaper kills sandboxes whose worker is gone, and only this system's", async () => {
    const provider = createE2BSandboxProvider(standinOptions({ system: nats.topology.systemId }));
    const otherPrefix = createE2BSandboxProvider(standinOptions({ prefix: "another-system" }));
    // The attack: another system with this one's prefix on the same E2B account. None of its
    // workers is in this system's presence list, so before sandboxes named their system, this
    // system's reaper took its sandboxes for orphans.
    const samePrefix = createE2BSandboxProvider(standinOptions({ system: "another-system-id" }));
    // A sandbox of a worker from before the system key: judged as before.
    const older = createE2BSandboxProvider(standinOptions());
    const made = [
      await provider.create(spec({ jobId: "orphan-job", workerId: "w-gone" })),
      await otherPrefix.create(spec({ jobId: "foreign-job", workerId: "w-gone" })),
      await samePrefix.create(spec({ jobId: "same-prefix-job", workerId: "w-gone" })),
      await older.create(spec({ jobId: "older-job", workerId: "w-gone" })),
    ];
    try {
      expect(sandboxOf("orphan-job")?.metadata.boxcarSystem).toBe(nats.topology.systemId);
      await using reaper = createWorker({ ...nats.workerRole, pools: ["elsewhere"], providers: [provider], reapIntervalMs: 200 });
      void reaper.run();
      await eventually(
        async () => (sandboxOf("orphan-job")?.state === "killed" && sandboxOf("older-job")?.state === "killed" ? true : undefined),
        "the reaper to kill the orphans",
      );
      expect(sandboxOf("orphan-job")?.killedBy).toBe("request");
      await new Promise((r) => setTimeout(r, 600)); // more of its passes
      expect(sandboxOf("foreign-job")?.state).toBe("running");
      expect(sandboxOf("same-prefix-job")?.state).toBe("running");
    } finally {
      for (const sandbox of made) await sandbox.destroy();
    }
  });

  describe("the provider on its own", () => {
    let provider: SandboxProvider;
    beforeAll(() => {
      provider = createE2BSandboxProvider(standinOptions());
    });

    test("without an API key it is not offered, and says what to set", async () => {
      const unconfigured = createE2BSandboxProvider({ apiUrl: standin.apiUrl });
      expect(await unconfigured.available()).toBe(false);
      expect(await provider.available()).toBe(true);
      await expect(unconfigured.create(spec())).rejects.toMatchObject({
        code: "sandbox_failed",
        message: expect.stringContaining("E2B_API_KEY"),
      });
    });

    test("aborting exec kills the agent and everything it started before exec returns", async () => {
      const sandbox = await provider.create(spec({ jobId: "abort-exec" }));
      try {
        const abort = new AbortController();
        const remote = sandboxOf("abort-exec");
        const running = sandbox.exec(["bash", "-c", "sleep 300 & sleep 300 & wait"], {
          env: { PATH: "/usr/bin:/bin" },
          signal: abort.signal,
          onOutput() {},
        });
        await eventually(async () => ((await remote?.alive())?.length ?? 0) >= 3 || undefined, "the agent and its children to run");
        abort.abort();
        expect(await running).toMatchObject({ aborted: true, exitCode: null, signal: "SIGKILL" });
        expect(await remote?.alive()).toEqual([]);
        expect(remote?.state).toBe("running");
      } finally {
        await sandbox.destroy();
      }
      expect(sandboxOf("abort-exec")?.state).toBe("killed");
    });

    test("output streams as it arrives", async () => {
      const sandbox = await provider.create(spec({ jobId: "streaming" }));
      try {
        const chunks: Array<{ stream: string; text: string; at: number }> = [];
        const result = await sandbox.exec(["bash", "-c", "echo first; echo err >&2; sleep 1; echo second"], {
          env: { PATH: "/usr/bin:/bin" },
          signal: new AbortController().signal,
          onOutput(stream, chunk) {
            chunks.push({ stream, text: new TextDecoder().decode(chunk), at: performance.now() });
          },
        });
        expect(result).toMatchObject({ exitCode: 0, signal: null, aborted: false });
        const text = (stream: string) =>
          chunks
            .filter((c) => c.stream === stream)
            .map((c) => c.text)
            .join("");
        expect(text("stdout")).toBe("first\nsecond\n");
        expect(text("stderr")).toBe("err\n");
        // The early lines were delivered while the command still slept, not when it ended.
        const last = chunks.at(-1);
        const early = chunks.filter((c) => !c.text.includes("second"));
        expect(last?.text).toContain("second");
        expect((last?.at ?? 0) - Math.max(...early.map((c) => c.at))).toBeGreaterThan(500);
      } finally {
        await sandbox.destroy();
      }
    });

    test("the sandbox's own timeout is a backstop: past it, E2B kills the sandbox and the run fails clearly", async () => {
      const short = createE2BSandboxProvider(standinOptions({ timeoutMarginMs: 0 }));
      const sandbox = await short.create(spec({ jobId: "backstop", timeout: 1000 }));
      const started = performance.now();
      try {
        await expect(
          sandbox.exec(["sleep", "30"], { env: { PATH: "/usr/bin:/bin" }, signal: new AbortController().signal, onOutput() {} }),
        ).rejects.toMatchObject({ code: "sandbox_failed", message: expect.stringContaining("the sandbox is gone") });
        expect(performance.now() - started).toBeLessThan(10_000);
        expect(sandboxOf("backstop")?.killedBy).toBe("timeout");
      } finally {
        await sandbox.destroy();
      }
    });

    test("one attempt alive: a job's sandbox ends with its attempt's lease unless renewed, and a new attempt kills its job's earlier ones by id", async () => {
      // A 3 s lease: E2B ends the sandbox 2 s after the last confirmed renewal (its stop time, 2.5 s, in
      // whole seconds, cut down), and nothing renews this one.
      const sandbox = await provider.create(spec({ jobId: "lapsing" }));
      try {
        const lease = new AttemptLease(3_000);
        await expect(
          sandbox.exec(["sleep", "300"], {
            env: { PATH: "/usr/bin:/bin" },
            signal: new AbortController().signal,
            onOutput() {},
            attemptLease: lease,
          }),
        ).rejects.toMatchObject({ code: "sandbox_failed" });
        expect(sandboxOf("lapsing")).toMatchObject({ killedBy: "timeout", timeouts: [60 + 300, 2] });
      } finally {
        await sandbox.destroy();
      }

      // A job run in a session's sandbox leaves the session's lifetime as it was: the session holds it, not the job's lease.
      const session = await provider.createSession?.(spec({ jobId: "a-session" }));
      try {
        const ran = await session?.exec(["true"], {
          env: { PATH: "/usr/bin:/bin" },
          signal: new AbortController().signal,
          onOutput() {},
          attemptLease: new AttemptLease(3_000),
        });
        expect(ran?.exitCode).toBe(0);
        const timeouts = standin.sandboxes().find((s) => s.metadata.boxcarSession === "a-session")?.timeouts ?? [];
        expect(Math.min(...timeouts)).toBeGreaterThan(60);
      } finally {
        await session?.destroy();
      }

      // Attempt 1's sandbox (its worker frozen) and attempt 2's own: the second is left alone.
      const first = await provider.create(spec({ jobId: "retried" }));
      const second = await provider.create({ ...spec({ jobId: "retried" }), attempt: 2 });
      try {
        expect(await provider.removeEarlierAttempts?.("retried", 2)).toBe(1);
        const [one, two] = standin.sandboxes().filter((s) => s.metadata.boxcarJob === "retried");
        expect([one?.metadata.boxcarAttempt, one?.state, one?.killedBy]).toEqual(["1", "killed", "request"]);
        expect([two?.metadata.boxcarAttempt, two?.state]).toEqual(["2", "running"]);
      } finally {
        await Promise.all([first.destroy(), second.destroy()]);
      }
    });

    test("a creation abandoned by its signal leaves no sandbox behind", async () => {
      const abort = new AbortController();
      const creating = provider.create(spec({ jobId: "abandoned" }), abort.signal);
      abort.abort();
      await expect(creating).rejects.toThrow();
      await eventually(async () => (sandboxOf("abandoned")?.state === "killed" ? true : undefined), "the late sandbox to be killed");
    });

    test("files: paths stay in the workspace; missing files and folders read as null; listings hold regular files only", async () => {
      const sandbox = await provider.create(spec({ jobId: "files" }));
      try {
        await expect(sandbox.writeFile("../escape", new Uint8Array([1]))).rejects.toMatchObject({ code: "invalid" });
        await expect(sandbox.mkdir("/etc/x")).rejects.toMatchObject({ code: "invalid" });
        await sandbox.mkdir("a/b");
        await sandbox.writeFile("a/b/c.txt", new TextEncoder().encode("hello"));
        await sandbox.writeFile("streamed.bin", new Blob([new Uint8Array([0, 1, 2, 255])]).stream());
        expect(await sandbox.readFile("missing.txt")).toBeNull();
        expect(await sandbox.readFile("a/b")).toBeNull();
        const body = await sandbox.readFile("a/b/c.txt");
        expect(await new Response(body).text()).toBe("hello");
        await sandbox.exec(["ln", "-s", "/etc", "link"], {
          env: { PATH: "/usr/bin:/bin" },
          signal: new AbortController().signal,
          onOutput() {},
        });
        expect((await sandbox.listFiles()).sort((x, y) => x.path.localeCompare(y.path))).toEqual([
          { path: "a/b/c.txt", size: 5 },
          { path: "streamed.bin", size: 4 },
        ]);
      } finally {
        await sandbox.destroy();
        await sandbox.destroy();
      }
      await expect(sandbox.readFile("a/b/c.txt")).rejects.toMatchObject({ code: "sandbox_failed" });
    });

    test("E2B unreachable is unavailable; its quota reached (429) is sandbox_failed", async () => {
      const port = await closedPort();
      const unreachable = createE2BSandboxProvider(standinOptions({ apiUrl: `http://127.0.0.1:${port}` }));
      await expect(unreachable.create(spec())).rejects.toMatchObject({
        code: "unavailable",
        message: expect.stringContaining("cannot reach E2B"),
      });

      const running = standin.sandboxes().filter((s) => s.state === "running").length;
      standin.maxRunning = running;
      try {
        await expect(provider.create(spec())).rejects.toMatchObject({
          code: "sandbox_failed",
          message: expect.stringContaining("(429)"),
        });
      } finally {
        standin.maxRunning = Number.POSITIVE_INFINITY;
      }
    });
  });

  test("a worker configured from its environment (E2B_API_KEY) runs an auto agent in E2B, the strongest isolation", async () => {
    await using fromEnv = createWorker({
      ...workerOptionsFromConfig(
        { pools: ["fromenv"], sandbox: { e2b: { apiUrl: standin.apiUrl, sandboxUrl: standin.sandboxUrl } } },
        nats.workerRole.topology,
        { E2B_API_KEY: standin.apiKey },
      ),
      dispatcherKeys: nats.workerRole.dispatcherKeys,
    });
    void fromEnv.run();
    await client.applyAgent({ name: "anywhere", pool: "fromenv", command: ["bash", "-c", "echo hi"] });
    await eventually(
      async () => ((await client.listWorkers()).some((w) => w.id === fromEnv.id) ? true : undefined),
      "the worker to be live",
    );
    const { job } = await client.submit({ agent: "anywhere" });
    const final = await client.waitForJob(job.id);
    expect(final.state).toBe("succeeded");
    expect(final.sandbox).toMatchObject({ kind: "e2b", reason: expect.stringMatching(/^auto: e2b/) });
  });
});

function spec(opts: { jobId?: string; workerId?: string; timeout?: number } = {}): SandboxSpec {
  const runtime: RuntimeWishes = { sandbox: "e2b", network: "none", timeout: opts.timeout ?? 60_000, limits: {} };
  return {
    id: `sbx-${randomBytes(6).toString("hex")}`,
    jobId: opts.jobId ?? `job-${randomBytes(4).toString("hex")}`,
    attempt: 1,
    workerId: opts.workerId ?? "w-test",
    runtime,
  };
}

/** Whether a process runs (a zombie waiting to be reaped does not). */
async function isAlive(pid: number): Promise<boolean> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
  return stat !== "" && stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
}

/** A port nothing listens on. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}
