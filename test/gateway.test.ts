import { randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import Anthropic from "@anthropic-ai/sdk";
import { createClient } from "@boxcar/client";
import { silentLogger } from "@boxcar/common";
import { startDispatcher } from "@boxcar/dispatcher";
import { type ModelCall, type ModelLimit, recordedCallObject } from "@boxcar/protocol";
import { dockerReady, eventually, localSystem, natsFixture, scratch } from "@boxcar/testing";
import {
  type CallRecorder,
  createDockerSandboxProvider,
  createWorker,
  kvCallLimiter,
  ModelGateway,
  type RecordedAnswer,
} from "@boxcar/worker";
import { trace } from "@opentelemetry/api";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import OpenAI from "openai";
import { Registry } from "prom-client";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar, spawnBoxcar } from "./helpers/cli.js";
import { type ModelStandIn, STANDIN_USAGE, startModelStandIn } from "./helpers/model-standin.js";

/**
 * The model gateway (docs/models.md), with the official SDKs (`openai`, `@anthropic-ai/sdk`)
 * as its clients, unchanged, and a stand-in provider speaking the real wire formats behind it.
 */

const KEYS = { anthropic: "sk-ant-real-provider-key-0123456789", openai: "sk-proj-real-provider-key-0123456789" };

let standIn: ModelStandIn;
let gateway: ModelGateway;
// An application's tracing SDK in this process: the worker's spans, the gateway's included, go to it.
const spans = new InMemorySpanExporter();
beforeAll(() => {
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }));
});
afterAll(() => {
  trace.disable();
});
beforeAll(async () => {
  standIn = await startModelStandIn();
  gateway = await ModelGateway.start(
    {
      providers: {
        anthropic: { key: KEYS.anthropic, baseUrl: standIn.anthropicUrl },
        openai: { key: KEYS.openai, baseUrl: standIn.openaiUrl },
      },
    },
    silentLogger,
  );
});
afterAll(async () => {
  await gateway?.close();
  await standIn?.close();
});

/** A pass for one attempt, the calls it reported, and SDK clients configured only from its variables. */
function attempt(providers: ("anthropic" | "openai")[] = ["anthropic", "openai"]) {
  const calls: ModelCall[] = [];
  const pass = gateway.open({ jobId: "j-gw", attempt: 1, providers, onCall: (call) => calls.push(call) });
  const env = pass.env();
  const openai = new OpenAI({ baseURL: env.OPENAI_BASE_URL, apiKey: env.OPENAI_API_KEY ?? "none", maxRetries: 0 });
  const anthropic = new Anthropic({ baseURL: env.ANTHROPIC_BASE_URL, apiKey: env.ANTHROPIC_API_KEY ?? "none", maxRetries: 0 });
  return { pass, env, calls, openai, anthropic };
}

const lastRequest = () => standIn.requests[standIn.requests.length - 1];

describe("the model gateway, with the official SDKs as clients", () => {
  test("OpenAI Chat Completions, plain and streamed: answers pass unchanged, the provider gets the key and never the token, each call is metered", async () => {
    const { pass, env, calls, openai } = attempt();
    try {
      expect(env.OPENAI_API_KEY).toMatch(/^bxm_/);
      const plain = await openai.chat.completions.create({ model: "gpt-test", messages: [{ role: "user", content: "hi" }] });
      expect(plain.choices[0]?.message.content).toBe("hello from the stand-in");
      expect(lastRequest()?.headers.authorization).toBe(`Bearer ${KEYS.openai}`);
      const stream = await openai.chat.completions.create({ model: "gpt-test", messages: [{ role: "user", content: "hi" }], stream: true });
      const chunks = [];
      for await (const chunk of stream) chunks.push(chunk);
      expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe("hello from the stand-in");
      // The usage the gateway asked for on the agent's behalf reached the gateway, not the agent.
      expect(lastRequest()?.body.stream_options).toEqual({ include_usage: true });
      expect(chunks.every((c) => c.choices.length > 0)).toBe(true);
      expect(calls.map((c) => [c.provider, c.endpoint, c.status, c.stream, c.model, c.tokensIn, c.tokensOut, c.cacheReadTokens])).toEqual([
        ["openai", "/chat/completions", 200, false, "gpt-test", STANDIN_USAGE.in, STANDIN_USAGE.out, STANDIN_USAGE.cacheRead],
        ["openai", "/chat/completions", 200, true, "gpt-test", STANDIN_USAGE.in, STANDIN_USAGE.out, STANDIN_USAGE.cacheRead],
      ]);
      expect(calls[1]?.firstByteMs).toBeGreaterThanOrEqual(0);
      expect(pass.usage).toMatchObject({ calls: 2, tokensIn: 2 * STANDIN_USAGE.in, tokensOut: 2 * STANDIN_USAGE.out });
      expect(standIn.requests.every((r) => !JSON.stringify(r.headers).includes(env.OPENAI_API_KEY as string))).toBe(true);
    } finally {
      pass.close();
    }
  });

  test("an agent that asked for the stream's usage itself gets it", async () => {
    const { pass, calls, openai } = attempt(["openai"]);
    try {
      const stream = await openai.chat.completions.create({
        model: "gpt-test",
        messages: [{ role: "user", content: "hi" }],
        stream: true,
        stream_options: { include_usage: true },
      });
      const chunks = [];
      for await (const chunk of stream) chunks.push(chunk);
      expect(chunks.at(-1)?.usage?.prompt_tokens).toBe(STANDIN_USAGE.in);
      expect(calls[0]?.tokensOut).toBe(STANDIN_USAGE.out);
    } finally {
      pass.close();
    }
  });

  test("OpenAI Responses, plain and streamed", async () => {
    const { pass, calls, openai } = attempt(["openai"]);
    try {
      const plain = await openai.responses.create({ model: "gpt-test", input: "hi" });
      expect(plain.output_text).toBe("hello from the stand-in");
      const stream = await openai.responses.create({ model: "gpt-test", input: "hi", stream: true });
      const types: string[] = [];
      for await (const event of stream) types.push(event.type);
      expect(types).toEqual(["response.created", "response.output_text.delta", "response.completed"]);
      expect(calls.map((c) => [c.endpoint, c.stream, c.tokensIn, c.tokensOut])).toEqual([
        ["/responses", false, STANDIN_USAGE.in, STANDIN_USAGE.out],
        ["/responses", true, STANDIN_USAGE.in, STANDIN_USAGE.out],
      ]);
    } finally {
      pass.close();
    }
  });

  test("Anthropic Messages, plain, streamed and with a tool call: cache tokens counted in and kept apart", async () => {
    const { pass, calls, anthropic } = attempt(["anthropic"]);
    try {
      const plain = await anthropic.messages.create({ model: "claude-test", max_tokens: 64, messages: [{ role: "user", content: "hi" }] });
      expect(plain.content[0]).toMatchObject({ type: "text", text: "hello from the stand-in" });
      expect(lastRequest()?.headers["x-api-key"]).toBe(KEYS.anthropic);
      expect(lastRequest()?.headers["anthropic-version"]).toBeDefined();
      const streamed = await anthropic.messages
        .stream({ model: "claude-test", max_tokens: 64, messages: [{ role: "user", content: "hi" }] })
        .finalMessage();
      expect(streamed.content[0]).toMatchObject({ type: "text", text: "hello from the stand-in" });
      standIn.script({ kind: "answer", tool: "read_file" });
      const tool = await anthropic.messages.create({
        model: "claude-test",
        max_tokens: 64,
        tools: [
          { name: "read_file", description: "reads a file", input_schema: { type: "object", properties: { path: { type: "string" } } } },
        ],
        messages: [{ role: "user", content: "read the readme" }],
      });
      expect(tool.content[0]).toMatchObject({ type: "tool_use", name: "read_file", input: { path: "README.md" } });
      const all = STANDIN_USAGE.in + STANDIN_USAGE.cacheRead + STANDIN_USAGE.cacheWrite;
      expect(calls.map((c) => [c.endpoint, c.stream, c.model, c.tokensIn, c.tokensOut, c.cacheReadTokens, c.cacheWriteTokens])).toEqual([
        ["/v1/messages", false, "claude-test", all, STANDIN_USAGE.out, STANDIN_USAGE.cacheRead, STANDIN_USAGE.cacheWrite],
        ["/v1/messages", true, "claude-test", all, STANDIN_USAGE.out, STANDIN_USAGE.cacheRead, STANDIN_USAGE.cacheWrite],
        ["/v1/messages", false, "claude-test", all, STANDIN_USAGE.out, STANDIN_USAGE.cacheRead, STANDIN_USAGE.cacheWrite],
      ]);
    } finally {
      pass.close();
    }
  });

  test("a recorded streamed answer is given again to the same request at the same place, read by the SDK as a stream; a different request there goes to the provider", async () => {
    const store = new Map<string, RecordedAnswer & { hash: string }>();
    const recorder: CallRecorder = {
      replay: async (position, hash) => {
        const found = store.get(String(position));
        return found?.hash === hash ? found : undefined;
      },
      record: async (position, hash, answer) => void store.set(String(position), { ...answer, hash }),
    };
    const ask = async (content: string) => {
      const calls: ModelCall[] = [];
      const pass = gateway.open({ jobId: "j-rec", attempt: 1, providers: ["openai"], onCall: (c) => calls.push(c), recorder });
      const env = pass.env();
      const openai = new OpenAI({ baseURL: env.OPENAI_BASE_URL, apiKey: env.OPENAI_API_KEY ?? "", maxRetries: 0 });
      const stream = await openai.chat.completions.create({ model: "gpt-test", messages: [{ role: "user", content }], stream: true });
      let text = "";
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? "";
      await new Promise((r) => setTimeout(r, 50)); // the recording is written as the answer ends
      pass.close();
      return { text, call: calls[0] };
    };
    const before = standIn.requests.length;
    const first = await ask("same");
    const again = await ask("same");
    expect(again).toMatchObject({ text: first.text, call: { replayed: true, tokensOut: STANDIN_USAGE.out } });
    expect(standIn.requests.length).toBe(before + 1);
    const other = await ask("different");
    expect(other.call?.replayed).toBeUndefined();
    expect(standIn.requests.length).toBe(before + 2);
  });

  test("refusals come in the provider's own shape, which the SDKs read: an ended attempt's token, a provider not allowed, a 429 with retry-after, a provider down", async () => {
    const { pass, env, calls, openai } = attempt(["openai"]);
    // Not on this agent's list (its variables name no Anthropic base): refused before anything is sent.
    expect(env.ANTHROPIC_BASE_URL).toBeUndefined();
    const anthropic = new Anthropic({ baseURL: `${env.BOXCAR_MODEL_GATEWAY}/anthropic`, apiKey: env.BOXCAR_MODEL_TOKEN, maxRetries: 0 });
    const before = standIn.requests.length;
    const forbidden = await anthropic.messages
      .create({ model: "claude-test", max_tokens: 8, messages: [{ role: "user", content: "hi" }] })
      .catch((e: unknown) => e);
    expect(forbidden).toBeInstanceOf(Anthropic.PermissionDeniedError);
    expect(standIn.requests.length).toBe(before);
    // The provider's 429 passes through, retry-after and all.
    standIn.script({ kind: "error", status: 429, retryAfter: 7 });
    const limited = (await openai.chat.completions.create({ model: "gpt-test", messages: [] }).catch((e: unknown) => e)) as InstanceType<
      typeof OpenAI.RateLimitError
    >;
    expect(limited).toBeInstanceOf(OpenAI.RateLimitError);
    expect(limited.headers?.get("retry-after")).toBe("7");
    expect(calls.at(-1)).toMatchObject({ status: 429, tokensIn: 0, tokensOut: 0 });
    // The attempt ended: its token is refused from now on.
    pass.close();
    const replayed = await openai.chat.completions.create({ model: "gpt-test", messages: [] }).catch((e: unknown) => e);
    expect(replayed).toBeInstanceOf(OpenAI.AuthenticationError);
    expect((replayed as Error).message).toContain("its attempt has ended");
    // A provider that cannot be reached: a 502 in its shape.
    const down = await ModelGateway.start({ providers: { openai: { key: "k", baseUrl: "http://127.0.0.1:9/v1" } } }, silentLogger);
    try {
      const p = down.open({ jobId: "j", attempt: 1, providers: ["openai"], onCall: () => {} });
      const env = p.env();
      const client = new OpenAI({ baseURL: env.OPENAI_BASE_URL, apiKey: env.OPENAI_API_KEY ?? "", maxRetries: 0 });
      const err = await client.chat.completions.create({ model: "m", messages: [] }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      expect((err as Error).message).toContain("could not be reached");
      p.close();
    } finally {
      await down.close();
    }
  });
});

describe("the fleet's model limits, counted in NATS by every gateway together", () => {
  test("3 requests per window across two workers' gateways: 3 reach the provider, the rest get the provider's 429 with retry-after; a call that may wait gets the next window", async () => {
    await using standInL = await startModelStandIn();
    const nats = await natsFixture();
    await using _nats = nats;
    const { topology } = nats;
    const providers = { openai: { key: KEYS.openai, baseUrl: standInL.openaiUrl } };
    const gateways = [await ModelGateway.start({ providers }, silentLogger), await ModelGateway.start({ providers }, silentLogger)];
    try {
      const limits: ModelLimit[] = [{ provider: "openai", model: "gpt-test", requests: 3, per: 3_600_000, wait: 0 }];
      const limiter = kvCallLimiter(() => topology.modelUse(), limits);
      const clients = gateways.map((g) => {
        const env = g.open({ jobId: "j-limits", attempt: 1, providers: ["openai"], onCall: () => {}, limiter }).env();
        return new OpenAI({ baseURL: env.OPENAI_BASE_URL, apiKey: env.OPENAI_API_KEY ?? "", maxRetries: 0 });
      });
      const results = await Promise.all(
        Array.from({ length: 6 }, (_, i) =>
          (clients[i % 2] as OpenAI).chat.completions.create({ model: "gpt-test", messages: [{ role: "user", content: `${i}` }] }).then(
            () => 200,
            (e: unknown) => e,
          ),
        ),
      );
      expect(results.filter((r) => r === 200)).toHaveLength(3);
      const refused = results.filter((r) => r !== 200) as InstanceType<typeof OpenAI.RateLimitError>[];
      expect(refused).toHaveLength(3);
      for (const r of refused) {
        expect(r).toBeInstanceOf(OpenAI.RateLimitError);
        expect(Number(r.headers?.get("retry-after"))).toBeGreaterThan(0);
        expect(r.message).toContain("the fleet's limit on openai gpt-test calls is reached");
      }
      expect(standInL.requests).toHaveLength(3);
      // Another model of the provider is not under that limit.
      await (clients[0] as OpenAI).chat.completions.create({ model: "gpt-other", messages: [] });
      expect(standInL.requests).toHaveLength(4);

      // One call per 2 s window, and a wait of 5 s: the second call waits for the next window.
      const waiting = kvCallLimiter(() => topology.modelUse(), [{ provider: "openai", requests: 1, per: 2_000, wait: 5_000 }]);
      const env = (gateways[1] as ModelGateway)
        .open({ jobId: "j-wait", attempt: 1, providers: ["openai"], onCall: () => {}, limiter: waiting })
        .env();
      const patient = new OpenAI({ baseURL: env.OPENAI_BASE_URL, apiKey: env.OPENAI_API_KEY ?? "", maxRetries: 0 });
      const windows: number[] = [];
      for (let i = 0; i < 2; i++) {
        await patient.chat.completions.create({ model: "gpt-test", messages: [] });
        windows.push(Math.floor(Date.now() / 2_000));
      }
      expect(windows[1]).toBeGreaterThan(windows[0] as number);
      expect(standInL.requests).toHaveLength(6);
    } finally {
      for (const g of gateways) await g.close();
    }
  }, 30_000);
});

const AGENT = fileURLToPath(new URL("./fixtures/gateway-agent.mjs", import.meta.url));
const HUNTER = fileURLToPath(new URL("./fixtures/key-hunter.mjs", import.meta.url));
const FIVE_CALLS = fileURLToPath(new URL("./fixtures/five-calls.mjs", import.meta.url));
const BUDGET_CALLER = fileURLToPath(new URL("./fixtures/budget-caller.mjs", import.meta.url));

describe("an agent's model calls through its worker", () => {
  test("a host agent calls both providers with the SDKs: it holds no key, each call is a model_call event and a usage event the gateway counted, and its token dies with its attempt", async () => {
    await using standInE2e = await startModelStandIn();
    const keyVars = { BOXCAR_TEST_ANTHROPIC: KEYS.anthropic, BOXCAR_TEST_OPENAI: KEYS.openai };
    const registry = new Registry();
    await using system = await localSystem({
      worker: {
        metrics: registry,
        modelGateway: {
          providers: {
            anthropic: { key: keyVars.BOXCAR_TEST_ANTHROPIC, baseUrl: standInE2e.anthropicUrl },
            openai: { key: keyVars.BOXCAR_TEST_OPENAI, baseUrl: standInE2e.openaiUrl },
          },
        },
      },
    });
    const { client } = system;
    // Prices per million tokens: Anthropic's cache tokens at their own price, OpenAI's as plain input.
    await client.setPolicy({
      prices: { "claude-test": { in: 3, out: 15, cacheRead: 0.3, cacheWrite: 3.75 }, "gpt-test": { in: 1, out: 2 } },
    });
    await client.applyAgent({
      name: "caller",
      command: ["node", AGENT],
      runtime: { sandbox: "host" },
      trusted: true,
      models: { providers: ["anthropic", "openai"] },
    });
    const { job } = await client.submit({ agent: "caller", input: {} });
    const done = await client.waitForJob(job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    const seen = done.result?.output as { env: Record<string, string>; texts: string[] };
    expect(seen.texts).toEqual(["hello from the stand-in", "hello from the stand-in"]);
    // The agent's whole environment holds neither key; its variables point at the gateway.
    const envText = JSON.stringify(seen.env);
    expect(envText).not.toContain(KEYS.anthropic);
    expect(envText).not.toContain(KEYS.openai);
    expect(seen.env.ANTHROPIC_BASE_URL).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/anthropic$/);
    expect(seen.env.OPENAI_API_KEY).toBe(seen.env.BOXCAR_MODEL_TOKEN);
    // Each call: a model_call event, and a usage event counted by the gateway.
    const events = [];
    for await (const e of client.events(job.id)) if (e.kind === "job") events.push(e);
    const modelCalls = events.filter((e) => e.type === "model_call");
    expect(modelCalls.map((e) => [e.call?.provider, e.call?.status, e.call?.tokensOut])).toEqual([
      ["anthropic", 200, STANDIN_USAGE.out],
      ["openai", 200, STANDIN_USAGE.out],
    ]);
    // Priced by the system policy: (11 x 3 + 3 x 0.3 + 2 x 3.75 + 7 x 15) / 1e6, and (11 x 1 + 7 x 2) / 1e6.
    const anthropicCost =
      (STANDIN_USAGE.in * 3 + STANDIN_USAGE.cacheRead * 0.3 + STANDIN_USAGE.cacheWrite * 3.75 + STANDIN_USAGE.out * 15) / 1e6;
    const openaiCost = (STANDIN_USAGE.in * 1 + STANDIN_USAGE.out * 2) / 1e6;
    expect(modelCalls[0]?.call?.cost).toBeCloseTo(anthropicCost, 12);
    expect(modelCalls[1]?.call?.cost).toBeCloseTo(openaiCost, 12);
    const usage = events.filter((e) => e.type === "usage");
    expect(usage.map((e) => e.usageBy)).toEqual(["gateway", "gateway"]);
    expect(JSON.stringify(events)).not.toContain("hi from the agent"); // no prompt text in any event
    expect(done.usage).toMatchObject({ calls: 2, tokensOut: 2 * STANDIN_USAGE.out });
    expect(done.usage?.cost).toBeCloseTo(anthropicCost + openaiCost, 12);
    // The token, replayed after the attempt ended, is refused.
    const replay = new OpenAI({ baseURL: seen.env.OPENAI_BASE_URL, apiKey: seen.env.OPENAI_API_KEY ?? "", maxRetries: 0 });
    expect(await replay.chat.completions.create({ model: "m", messages: [] }).catch((e: unknown) => e)).toBeInstanceOf(
      OpenAI.AuthenticationError,
    );
    expect(standInE2e.requests.length).toBe(2);
    // boxcar status lists the calls.
    const status = await boxcar(system.nats.url, system.nats.topology.names.prefix, ["status", job.id]);
    expect(status.code, status.stderr).toBe(0);
    expect(status.stdout).toContain("model calls (2):");
    expect(status.stdout).toMatch(/anthropic\s+claude-test\s+200\s+16\s+7/);
    expect(status.stdout).toMatch(/openai\s+gpt-test\s+200\s+11\s+7/);
    // Metrics per provider, model and status.
    const metrics = await registry.getSingleMetricAsString("boxcar_worker_model_calls_total");
    expect(metrics).toContain('boxcar_worker_model_calls_total{provider="anthropic",model="claude-test",status="200"} 1');
    expect(metrics).toContain('boxcar_worker_model_calls_total{provider="openai",model="gpt-test",status="200"} 1');
    // A span per call, a child of the attempt's.
    const attempt = spans.getFinishedSpans().find((s) => s.name === "job.attempt" && s.attributes["boxcar.job.id"] === job.id);
    const calls = spans.getFinishedSpans().filter((s) => s.name.startsWith("model.call") && s.attributes["boxcar.job.id"] === job.id);
    expect(calls.map((s) => s.name).sort()).toEqual(["model.call anthropic", "model.call openai"]);
    for (const s of calls) {
      expect(s.parentSpanContext?.spanId).toBe(attempt?.spanContext().spanId);
      expect(s.attributes["gen_ai.usage.output_tokens"]).toBe(STANDIN_USAGE.out);
    }
  }, 60_000);

  test("recorded calls: a job cut short after 3 of its 5 calls runs again with 2 provider calls, the first 3 answered from its recording; cleaning the job removes the recording", async () => {
    await using standInE2e = await startModelStandIn();
    await using system = await localSystem({
      worker: { modelGateway: { providers: { openai: { key: KEYS.openai, baseUrl: standInE2e.openaiUrl } } } },
    });
    const { client } = system;
    await client.applyAgent({
      name: "five-calls",
      command: ["node", FIVE_CALLS],
      runtime: { sandbox: "host" },
      trusted: true,
      retry: { maxAttempts: 2, delay: "100ms" },
      models: { providers: ["openai"], record: true },
    });
    const { job } = await client.submit({ agent: "five-calls", input: {} });
    const done = await client.waitForJob(job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    expect(done.attempt).toBe(2);
    expect((done.result?.output as { texts: string[] } | undefined)?.texts).toHaveLength(5);
    // 3 calls in the first attempt, then only the last 2 of the second reach the provider.
    expect(standInE2e.requests.map((r) => (r.body.messages as { content: string }[])[0]?.content)).toEqual([
      "step 1",
      "step 2",
      "step 3",
      "step 4",
      "step 5",
    ]);
    const calls = [];
    for await (const e of client.events(job.id))
      if (e.kind === "job" && e.type === "model_call") calls.push([e.attempt, e.call?.replayed ?? false]);
    expect(calls).toEqual([
      [1, false],
      [1, false],
      [1, false],
      [2, true],
      [2, true],
      [2, true],
      [2, false],
      [2, false],
    ]);
    // The provider's tokens count once: 5 calls' worth, over 8 calls.
    expect(done.usage).toMatchObject({ calls: 8, tokensOut: 5 * STANDIN_USAGE.out });
    const recorded = async () => {
      const found = [];
      for (let n = 1; n <= 5; n++) {
        const info = await system.nats.topology.artifacts.info(recordedCallObject(job.id, n));
        if (info && !info.deleted) found.push(n);
      }
      return found;
    };
    expect(await recorded()).toEqual([1, 2, 3, 4, 5]);
    expect(await client.cleanJobs({ olderThan: 0, agent: "five-calls" })).toMatchObject({ deleted: 1 });
    expect(await recorded()).toEqual([]);
  }, 60_000);

  test("the policy's model limits hold for an agent's calls through its worker (a worker's own credential counts them)", async () => {
    await using standInE2e = await startModelStandIn();
    await using system = await localSystem({
      worker: { modelGateway: { providers: { openai: { key: KEYS.openai, baseUrl: standInE2e.openaiUrl } } } },
    });
    const { client } = system;
    await client.setPolicy({ modelLimits: [{ provider: "openai", requests: 1, per: "1h", wait: 0 }] });
    await client.applyAgent({
      name: "limited-caller",
      command: ["node", FIVE_CALLS],
      runtime: { sandbox: "host" },
      trusted: true,
      models: { providers: ["openai"] },
    });
    const { job } = await client.submit({ agent: "limited-caller", input: {} });
    const done = await client.waitForJob(job.id);
    expect(done.state).toBe("failed"); // its second call was refused, and the agent gave up
    const statuses = [];
    for await (const e of client.events(job.id)) if (e.kind === "job" && e.type === "model_call") statuses.push(e.call?.status);
    expect(statuses).toEqual([200, 429]);
    expect(standInE2e.requests).toHaveLength(1);
  }, 60_000);

  test("a budget that stops, once spent, refuses the agent's next call as a provider refuses a key with no quota: the SDK does not try again", async () => {
    await using standInE2e = await startModelStandIn();
    await using system = await localSystem({
      worker: { modelGateway: { providers: { openai: { key: KEYS.openai, baseUrl: standInE2e.openaiUrl } } } },
    });
    const { client } = system;
    await client.setPolicy({ budgets: { agents: { "budget-caller": { tokens: 100, onExceeded: "stop" } } } });
    await client.applyAgent({
      name: "budget-caller",
      command: ["node", BUDGET_CALLER],
      runtime: { sandbox: "host" },
      trusted: true,
      models: { providers: ["openai"] },
    });
    await using dir = await scratch("budget-");
    const go = join(dir.path, "go");
    const { job } = await client.submit({ agent: "budget-caller", input: { go } });
    await eventually(async () => ((await client.getJob(job.id)).state === "running" ? true : undefined), "the job to run");
    // Another job's calls spent the budget: the dispatchers summed them (written here as they
    // write it, so no usage event of this job's makes the dispatcher stop it first).
    const day = new Date().toISOString().slice(0, 10);
    await (await system.nats.topology.usage()).put(
      `${day}.agent.budget-caller`,
      JSON.stringify({ calls: 3, tokensIn: 90, tokensOut: 30, cost: 0, seq: 1 }),
    );
    await writeFile(go, "");
    const done = await client.waitForJob(job.id);
    const seen = [];
    for await (const e of client.events(job.id)) seen.push(`${e.type}: ${e.message ?? ""}`);
    expect(done.state, seen.join("\n")).toBe("succeeded");
    expect(done.result?.output).toMatchObject({ status: 429, code: "insufficient_quota" });
    expect((done.result?.output as { message?: string } | undefined)?.message).toContain(
      `agent budget-caller has spent its budget for ${day} (UTC), which stops its calls (onExceeded: stop): cost 0, 120 tokens of 100`,
    );
    expect(standInE2e.requests).toHaveLength(0);
    const calls = [];
    for await (const e of client.events(job.id)) if (e.kind === "job" && (e.type === "model_call" || e.type === "usage")) calls.push(e);
    // Once (x-should-retry told the SDK not to try again), and no usage: the provider was not called.
    expect(calls.map((e) => [e.type, e.call?.status, e.call?.refused])).toEqual([["model_call", 429, "budget"]]);
  }, 60_000);

  test("attack: an agent hunting for the key (its environment, every process's environment and command line, its files) finds none when host agents run as their own user; run as the worker's user, it finds it in the worker's environment", async () => {
    await using standInE2e = await startModelStandIn();
    await using dir = await scratch("boxcar-gw-");
    const key = `sk-hunted-${randomBytes(12).toString("hex")}`;
    const nats = await natsFixture();
    await using _nats = nats;
    const dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    const client = createClient(nats.topology);
    /** Runs the hunter on a CLI worker holding the key in its own environment, as an operator starts one. */
    const hunt = async (hostUser: string | undefined) => {
      const config = join(dir.path, `worker-${hostUser ? "own-user" : "same-user"}.yaml`);
      await writeFile(config, `sandbox:\n  host: trusted\n${hostUser ? `  hostUser: "${hostUser}"\n` : ""}`);
      const worker = spawnBoxcar(
        nats.url,
        nats.topology.names.prefix,
        ["worker", "--config", config, "--model-key", "openai=BOXCAR_HUNTED_KEY", "--model-url", `openai=${standInE2e.openaiUrl}`],
        { BOXCAR_HUNTED_KEY: key },
      );
      try {
        const { job } = await client.submit({ agent: "hunter", input: { huntFor: key } });
        const done = await client.waitForJob(job.id);
        expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
        return done.result?.output as { found: string[]; status: number; uid: number };
      } finally {
        worker.kill("SIGTERM");
        await new Promise((r) => worker.once("exit", r));
      }
    };
    try {
      await client.applyAgent({
        name: "hunter",
        command: ["node", HUNTER],
        runtime: { sandbox: "host" },
        trusted: true,
        models: { providers: ["openai"] },
      });
      const apart = await hunt("65534:65534");
      expect(apart).toEqual({ found: [], status: 200, uid: 65534 });
      // The control: the same hunt as the worker's own user reads the worker's environment. The
      // host sandbox is for trusted agents; run them as their own user (hostUser), or use Docker.
      const together = await hunt(undefined);
      expect(together.status).toBe(200);
      expect(together.found.some((where) => /^\/proc\/\d+\/environ$/.test(where))).toBe(true);
      expect(together.found).not.toContain("own environment");
      expect(standInE2e.requests.map((r) => r.headers.authorization)).toEqual([`Bearer ${key}`, `Bearer ${key}`]);
    } finally {
      await dispatcher.close();
    }
  }, 90_000);
});

const dockerOk = await dockerReady();

describe.skipIf(!dockerOk)("an agent in a Docker container with no network", () => {
  test.each(["cold", "warm"] as const)(
    "%s container: reaches both providers through the gateway's socket in its workspace and the forwarder beside it; it holds no key, and its calls are metered",
    async (start) => {
      await using standInE2e = await startModelStandIn();
      const nats = await natsFixture();
      await using _nats = nats;
      const dispatcher = await startDispatcher({ ...nats.dispatcherRole });
      const worker = createWorker({
        ...nats.workerRole,
        providers: [
          createDockerSandboxProvider({
            prefix: nats.topology.names.prefix,
            system: nats.topology.systemId,
            warm: start === "warm" ? 1 : 0,
          }),
        ],
        modelGateway: {
          providers: {
            anthropic: { key: KEYS.anthropic, baseUrl: standInE2e.anthropicUrl },
            openai: { key: KEYS.openai, baseUrl: standInE2e.openaiUrl },
          },
        },
      });
      void worker.run();
      try {
        const client = createClient(nats.topology);
        // Plain fetch in the agent image's Node.js: the SDKs' requests, by hand.
        const agent = `
        const call = (url, headers, body) => fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) }).then(async (r) => [r.status, await r.json()]);
        const [as, a] = await call(process.env.ANTHROPIC_BASE_URL + "/v1/messages", { "x-api-key": process.env.ANTHROPIC_API_KEY, "anthropic-version": "2023-06-01" }, { model: "claude-test", max_tokens: 8, messages: [{ role: "user", content: "hi" }] });
        const [os, o] = await call(process.env.OPENAI_BASE_URL + "/chat/completions", { authorization: "Bearer " + process.env.OPENAI_API_KEY }, { model: "gpt-test", messages: [{ role: "user", content: "hi" }] });
        let outside = "refused";
        try { await fetch("http://" + "1.1.1.1/", { signal: AbortSignal.timeout(2000) }); outside = "reached"; } catch {}
        require("node:fs").writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: { statuses: [as, os], texts: [a.content[0].text, o.choices[0].message.content], env: process.env, outside } }));
      `;
        await client.applyAgent({
          name: "boxed-caller",
          command: ["node", "-e", `(async () => { ${agent} })().catch((e) => { console.error(e); process.exit(1); })`],
          runtime: { sandbox: "docker", ...(start === "warm" ? { warm: true } : {}) },
          models: { providers: ["anthropic", "openai"] },
        });
        if (start === "warm") {
          await eventually(
            async () => ((await client.listWorkers()).some((w) => (w.warm ?? 0) >= 1) ? true : undefined),
            "a warm container",
            60_000,
          );
        }
        const { job } = await client.submit({ agent: "boxed-caller", input: {} });
        const done = await client.waitForJob(job.id);
        const events = [];
        for await (const e of client.events(job.id)) if (e.kind === "sandbox" && e.type === "ready") events.push(e.start);
        expect(events).toEqual([start === "warm" ? "warm_hit" : "cold"]);
        expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
        const seen = done.result?.output as { statuses: number[]; texts: string[]; env: Record<string, string>; outside: string };
        expect(seen.statuses).toEqual([200, 200]);
        expect(seen.texts).toEqual(["hello from the stand-in", "hello from the stand-in"]);
        expect(seen.outside).toBe("refused"); // no network: only the gateway is reachable
        expect(seen.env.OPENAI_BASE_URL).toBe("http://127.0.0.1:4317/openai/v1");
        expect(JSON.stringify(seen.env)).not.toContain(KEYS.openai);
        expect(JSON.stringify(seen.env)).not.toContain(KEYS.anthropic);
        expect(done.usage).toMatchObject({ calls: 2 });
        expect(standInE2e.requests.map((r) => r.headers["x-api-key"] ?? r.headers.authorization)).toEqual([
          KEYS.anthropic,
          `Bearer ${KEYS.openai}`,
        ]);
      } finally {
        await worker.close();
        await dispatcher.close();
      }
    },
    120_000,
  );
});

// Live: the real providers, when their keys are set (never here: no model API is reachable).
const LIVE = { anthropic: process.env.ANTHROPIC_API_KEY, openai: process.env.OPENAI_API_KEY };

describe.skipIf(!LIVE.anthropic && !LIVE.openai)("live: the real providers through the gateway", () => {
  test("a short answer from each provider whose key is set, metered", async () => {
    const providers = Object.fromEntries(Object.entries(LIVE).flatMap(([p, key]) => (key ? [[p, { key }]] : [])));
    const live = await ModelGateway.start({ providers }, silentLogger);
    try {
      const calls: ModelCall[] = [];
      const pass = live.open({ jobId: "j-live", attempt: 1, providers: live.providers, onCall: (c) => calls.push(c) });
      const env = pass.env();
      if (LIVE.anthropic) {
        const client = new Anthropic({ baseURL: env.ANTHROPIC_BASE_URL, apiKey: env.ANTHROPIC_API_KEY ?? "", maxRetries: 0 });
        const model = process.env.BOXCAR_LIVE_ANTHROPIC_MODEL ?? "claude-3-5-haiku-latest";
        const answer = await client.messages.create({ model, max_tokens: 16, messages: [{ role: "user", content: "Say ok." }] });
        expect(answer.content.length).toBeGreaterThan(0);
      }
      if (LIVE.openai) {
        const client = new OpenAI({ baseURL: env.OPENAI_BASE_URL, apiKey: env.OPENAI_API_KEY ?? "", maxRetries: 0 });
        const model = process.env.BOXCAR_LIVE_OPENAI_MODEL ?? "gpt-4o-mini";
        const stream = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Say ok." }], stream: true });
        for await (const _ of stream) {
          // read to the end
        }
      }
      expect(calls.length).toBe(Object.keys(providers).length);
      for (const call of calls) expect(call).toMatchObject({ status: 200, tokensIn: expect.any(Number), tokensOut: expect.any(Number) });
      expect(calls.every((c) => c.tokensIn > 0 && c.tokensOut > 0)).toBe(true);
      pass.close();
    } finally {
      await live.close();
    }
  }, 60_000);
});
