import { expect, test } from "vitest";
import { AgentDefinition } from "./agent.js";
import { ErrorCode } from "./errors.js";
import { RuntimePolicy } from "./runtime.js";
import { modelsRefusal, type WorkerInfo, whyCannotServe } from "./worker-info.js";

const models = { providers: ["openai" as const], record: false };

test("an agent's providers must all be held by the worker, naming the flag that gives a key", () => {
  expect(modelsRefusal(models, "host", { providers: ["anthropic"], public: false })).toMatchObject({
    code: ErrorCode.missingSecret,
    message: expect.stringContaining("--model-key openai=VARIABLE"),
  });
  expect(modelsRefusal(models, "host", undefined)).toMatchObject({ code: ErrorCode.missingSecret });
  expect(modelsRefusal(undefined, "e2b", undefined)).toBeUndefined();
});

test("an E2B agent needs the gateway's public address; host and Docker agents do not", () => {
  expect(modelsRefusal(models, "e2b", { providers: ["openai"], public: false })).toMatchObject({
    code: ErrorCode.noSandbox,
    message: expect.stringContaining("--model-gateway-url"),
  });
  expect(modelsRefusal(models, "e2b", { providers: ["openai"], public: true })).toBeUndefined();
  expect(modelsRefusal(models, "docker", { providers: ["openai"], public: false })).toBeUndefined();
  // A prompt agent's loop calls from the worker itself, whatever its sandbox.
  expect(modelsRefusal(models, undefined, { providers: ["openai"], public: false })).toBeUndefined();
});

test("a worker's presence tells whether it holds an agent's keys; one of an earlier release, which does not say, is not held to it", () => {
  const worker: WorkerInfo = {
    ...{ v: 1, id: "w", host: "h", pid: 1, pools: ["default"], capacity: 1, load: 0, jobs: [], state: "running" },
    ...{ startedAt: new Date().toISOString(), heartbeatAt: new Date().toISOString(), heartbeatMs: 5000 },
    sandboxes: ["host"],
    policy: RuntimePolicy.parse({ host: "always" }),
  };
  const agent = AgentDefinition.parse({ name: "a", command: "true", runtime: { sandbox: "host" }, models });
  expect(whyCannotServe({ ...worker, models: { providers: ["anthropic"], public: false } }, agent)).toContain("holds no key for openai");
  expect(whyCannotServe({ ...worker, models: { providers: ["openai"], public: false } }, agent)).toBeUndefined();
  expect(whyCannotServe(worker, agent)).toBeUndefined();
});
