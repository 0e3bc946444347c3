import { describe, expect, test } from "vitest";
import { RuntimeWishes } from "./agent.js";
import { BoxcarError, ErrorCode } from "./errors.js";
import { RuntimePolicy, resolveRuntime, type SandboxBackend } from "./runtime.js";

const policy = (p: Parameters<typeof RuntimePolicy.parse>[0] = {}) => RuntimePolicy.parse(p);
const ALL: SandboxBackend[] = ["host", "docker", "e2b"];

type Row = [
  what: string,
  wishes: Partial<RuntimeWishes>,
  trusted: boolean,
  offered: SandboxBackend[],
  policy: RuntimePolicy,
  expected: SandboxBackend | RegExp,
];

// wishes × trust × what the worker offers × its policy → a sandbox, or a refusal that says what to change
const table: Row[] = [
  ["auto takes the strongest isolation: e2b", {}, false, ALL, policy(), "e2b"],
  ["auto takes docker without e2b", {}, false, ["host", "docker"], policy(), "docker"],
  ["auto follows the policy's preference", {}, false, ALL, policy({ prefer: ["docker", "e2b"] }), "docker"],
  ["auto skips what the policy does not allow", {}, false, ALL, policy({ allowed: ["host", "docker"] }), "docker"],
  ["auto runs a trusted agent on the host when nothing else is offered", {}, true, ["host"], policy(), "host"],
  ["auto runs an untrusted agent on the host when the policy says always", {}, false, ["host"], policy({ host: "always" }), "host"],
  ["auto refuses an untrusted agent on the host by default", {}, false, ["host"], policy(), /mark the agent `trusted: true`.*host: always/],
  ["auto refuses host when the policy says never, even trusted", {}, true, ["host"], policy({ host: "never" }), /allow host sandboxes/],
  ["auto with nothing offered says how to offer each", {}, true, [], policy(), /offers none: set E2B_API_KEY.*start a Docker engine/],
  ["auto with an image needs docker", { image: "alpine:3" }, false, ALL, policy(), "docker"],
  ["auto with an image but no docker", { image: "alpine:3" }, false, ["host", "e2b"], policy(), /needs a docker sandbox.*image/],
  ["auto with a template needs e2b", { template: "base" }, false, ALL, policy(), "e2b"],
  ["explicit docker", { sandbox: "docker" }, false, ALL, policy(), "docker"],
  ["explicit docker without an engine", { sandbox: "docker" }, false, ["host", "e2b"], policy(), /cannot offer now: start a Docker engine/],
  [
    "explicit docker the policy forbids",
    { sandbox: "docker" },
    false,
    ALL,
    policy({ allowed: ["host", "e2b"] }),
    /add docker to the worker's allowed/,
  ],
  ["explicit e2b without a key", { sandbox: "e2b" }, false, ["host", "docker"], policy(), /set E2B_API_KEY/],
  ["explicit host for a trusted agent", { sandbox: "host" }, true, ALL, policy(), "host"],
  ["explicit host for an untrusted agent", { sandbox: "host" }, false, ALL, policy(), /forbids for it: mark the agent `trusted: true`/],
  ["explicit host, policy always", { sandbox: "host" }, false, ALL, policy({ host: "always" }), "host"],
  [
    "explicit host, host not allowed at all",
    { sandbox: "host" },
    true,
    ALL,
    policy({ allowed: ["docker"] }),
    /add host to the worker's allowed/,
  ],
];

describe("resolveRuntime", () => {
  test.each(table)("%s", (_what, wishes, trusted, offered, p, expected) => {
    const run = () => resolveRuntime(RuntimeWishes.parse(wishes), trusted, new Set(offered), p);
    if (typeof expected === "string") {
      const resolved = run();
      expect(resolved.kind).toBe(expected);
      expect(resolved.reason).toMatch(/\w/);
      return;
    }
    let error: unknown;
    try {
      run();
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(BoxcarError);
    expect((error as BoxcarError).code).toBe(ErrorCode.noSandbox);
    expect((error as BoxcarError).message).toMatch(expected);
  });
});
