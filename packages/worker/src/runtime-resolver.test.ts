import { BoxcarError, ErrorCode, RuntimeWishes } from "@boxcar/protocol";
import { describe, expect, test } from "vitest";
import { type RuntimePolicy, resolveRuntime } from "./runtime-resolver.js";
import type { SandboxBackend } from "./sandbox.js";

const ALL: SandboxBackend[] = ["host", "docker", "e2b"];
const open: RuntimePolicy = { allowed: ALL, allowHost: true };

describe("resolveRuntime picks a sandbox", () => {
  test.each<[string, Partial<RuntimeWishes>, SandboxBackend[], RuntimePolicy, SandboxBackend]>([
    ["auto prefers docker", {}, ["host", "docker", "e2b"], open, "docker"],
    ["auto takes e2b without docker", {}, ["host", "e2b"], open, "e2b"],
    ["auto falls back to host", {}, ["host"], open, "host"],
    ["auto skips a backend the policy forbids", {}, ["host", "docker"], { allowed: ["host", "e2b"], allowHost: true }, "host"],
    ["auto with an image needs docker", { image: "alpine:3" }, ["host", "docker", "e2b"], open, "docker"],
    ["auto with a template needs e2b", { template: "base" }, ["host", "docker", "e2b"], open, "e2b"],
    ["explicit host", { sandbox: "host" }, ["host", "docker"], open, "host"],
    ["explicit docker", { sandbox: "docker" }, ["host", "docker"], open, "docker"],
  ])("%s", (_, wishes, offered, policy, expected) => {
    const resolved = resolveRuntime(RuntimeWishes.parse(wishes), new Set(offered), policy);
    expect(resolved.kind).toBe(expected);
    expect(resolved.reason).not.toBe("");
  });
});

describe("resolveRuntime refuses with no_sandbox and says what to change", () => {
  test.each<[string, Partial<RuntimeWishes>, SandboxBackend[], RuntimePolicy, RegExp]>([
    ["auto when host is not allowed and nothing else is offered", {}, ["host"], { allowed: ALL, allowHost: false }, /set allowHost/],
    ["auto when nothing is offered", {}, [], open, /offers none.*Docker engine.*E2B_API_KEY/],
    ["explicit docker without an engine", { sandbox: "docker" }, ["host"], open, /cannot offer.*Docker engine/],
    ["explicit e2b without a key", { sandbox: "e2b" }, ["host"], open, /E2B_API_KEY/],
    [
      "explicit docker the policy forbids",
      { sandbox: "docker" },
      ["host", "docker"],
      { allowed: ["host"], allowHost: true },
      /add docker to the worker's allowed sandboxes/,
    ],
    ["explicit host with allowHost off", { sandbox: "host" }, ["host"], { allowed: ALL, allowHost: false }, /forbids.*set allowHost/],
    ["an image when docker is missing", { image: "alpine:3" }, ["host", "e2b"], open, /needs a docker sandbox.*image/],
  ])("%s", (_, wishes, offered, policy, message) => {
    let error: unknown;
    try {
      resolveRuntime(RuntimeWishes.parse(wishes), new Set(offered), policy);
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(BoxcarError);
    expect((error as BoxcarError).code).toBe(ErrorCode.noSandbox);
    expect((error as BoxcarError).message).toMatch(message);
  });
});
