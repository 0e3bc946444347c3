import { ErrorCode } from "@boxcar/protocol";
import { expect, test } from "vitest";
import { checkModels } from "./models-check.js";

const models = { providers: ["openai" as const], record: false };

test("an agent's providers must all be held by the worker, naming the flag that gives a key", () => {
  expect(() => checkModels(models, "host", { providers: ["anthropic"] })).toThrow(
    expect.objectContaining({ code: ErrorCode.missingSecret, message: expect.stringContaining("--model-key openai=VARIABLE") }),
  );
  expect(() => checkModels(models, "host", undefined)).toThrow(expect.objectContaining({ code: ErrorCode.missingSecret }));
  expect(() => checkModels(undefined, "e2b", undefined)).not.toThrow();
});

test("an E2B agent needs the gateway's public address; host and Docker agents do not", () => {
  expect(() => checkModels(models, "e2b", { providers: ["openai"] })).toThrow(
    expect.objectContaining({ code: ErrorCode.noSandbox, message: expect.stringContaining("--model-gateway-url") }),
  );
  expect(() => checkModels(models, "e2b", { providers: ["openai"], publicUrl: "https://gw.example.org" })).not.toThrow();
  expect(() => checkModels(models, "docker", { providers: ["openai"] })).not.toThrow();
  // A prompt agent's loop calls from the worker itself, whatever its sandbox.
  expect(() => checkModels(models, undefined, { providers: ["openai"] })).not.toThrow();
});
