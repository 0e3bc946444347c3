import type { Topology } from "@boxcar/fabric";
import { BoxcarError, ErrorCode, names } from "@boxcar/protocol";
import { describe, expect, test } from "vitest";
import { createHostSandboxProvider } from "./sandbox/host/host-sandbox.js";
import { resolveWorkerOptions, type WorkerOptions } from "./worker-options.js";

// Resolving options reads only the topology's names (the Docker provider labels with the prefix).
const topology = { names: names("test") } as Topology;

function invalid(opts: Partial<WorkerOptions>): BoxcarError {
  try {
    resolveWorkerOptions({ topology, ...opts }, {});
  } catch (err) {
    expect(err).toBeInstanceOf(BoxcarError);
    return err as BoxcarError;
  }
  throw new Error("options were accepted");
}

describe("resolveWorkerOptions", () => {
  test("fills in defaults; PATH comes from the given environment, secrets only when allowed", () => {
    const env = { PATH: "/opt/bin:/bin", API_KEY: "k" };
    const resolved = resolveWorkerOptions({ topology }, env);
    expect(resolved).toMatchObject({
      pools: ["default"],
      concurrency: 4,
      policy: { allowed: ["host", "docker", "e2b"], prefer: ["e2b", "docker", "host"], host: "trusted" },
      heartbeatMs: 5_000,
      drainGraceMs: 30_000,
      maxLogBytes: 4 * 1024 * 1024,
      agentPath: "/opt/bin:/bin",
    });
    // No secret unless allowed: the environment's variables are not handed out by default.
    expect(resolved.secretsEnv).toEqual({});
    expect(resolveWorkerOptions({ topology, allowSecrets: ["PATH", "UNSET_ONE"] }, env).secretsEnv).toEqual({
      PATH: env.PATH,
      UNSET_ONE: undefined,
    });
    expect(resolved.workerId).toMatch(/^w-[A-Za-z0-9_-]+-[0-9a-f]{8}$/);
    expect(resolved.providers.map((p) => p.kind)).toEqual(["host", "docker"]);
    expect(resolved.reapIntervalMs).toBe(60_000);
    expect(resolveWorkerOptions({ topology }, {}).workerId).not.toBe(resolved.workerId);
  });

  test.each<[string, Partial<WorkerOptions>, string]>([
    ["no pools", { pools: [] }, "pools"],
    ["a pool that is not a subject token", { pools: ["a.b"] }, "pools[0]"],
    ["a repeated pool", { pools: ["a", "a"] }, "pools"],
    ["zero concurrency", { concurrency: 0 }, "concurrency"],
    ["a worker id with a dot", { workerId: "w.1" }, "workerId"],
    ["a negative drain grace", { drainGraceMs: -1 }, "drainGraceMs"],
  ])("rejects %s, naming the option", (_, opts, path) => {
    const err = invalid(opts);
    expect(err.code).toBe(ErrorCode.invalid);
    expect(err.issues.map((i) => i.path)).toContain(path);
  });

  test("rejects two providers of one kind", () => {
    const err = invalid({ providers: [createHostSandboxProvider(), createHostSandboxProvider()] });
    expect(err.message).toContain("two sandbox providers of kind host");
  });
});
