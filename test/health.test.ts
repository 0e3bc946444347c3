import { createClient } from "@boxcar/client";
import { eventually, natsFixture } from "@boxcar/testing";
import { expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { answers, healthOf, probe, type RoleProcess } from "./helpers/health.js";

test("each role's /readyz follows its phase and its NATS connection, and /healthz stays 200 until it stops", async () => {
  const nats = await natsFixture();
  const prefix = nats.topology.names.prefix;
  const roles: RoleProcess[] = [];
  try {
    const dispatcher = spawnBoxcar(nats.url, prefix, ["dispatcher", "--health", "127.0.0.1:0"]);
    const worker = spawnBoxcar(nats.url, prefix, ["worker", "--host", "always", "--drain-grace", "30s"], {
      BOXCAR_HEALTH: "127.0.0.1:0",
    });
    roles.push(dispatcher, worker);
    const [dispatcherHealth, workerHealth] = await Promise.all([healthOf(dispatcher), healthOf(worker)]);

    for (const base of [dispatcherHealth, workerHealth]) {
      expect(await answers(base, "/readyz", 200, "the role to be ready")).toEqual({ status: "ready", nats: "connected" });
      expect(await probe(base, "/healthz")).toEqual({ status: 200, body: '{"status":"alive"}\n' });
      expect((await probe(base, "/healthz", "HEAD")).status).toBe(200);
      expect((await probe(base, "/readyz", "POST")).status).toBe(405);
      expect((await probe(base, "/metrics")).status).toBe(404);
    }

    // A worker told to stop while a job runs drains: alive, no longer ready, until it exits.
    const client = createClient(nats.topology);
    await client.applyAgent({ name: "nap", command: "sleep 3", trusted: true, runtime: { sandbox: "host", timeout: "1m" } });
    const { job } = await client.submit({ agent: "nap" });
    await eventually(async () => ((await client.getJob(job.id)).state === "running" ? true : undefined), "the job to run");
    worker.kill("SIGTERM");
    expect(await answers(workerHealth, "/readyz", 503, "the worker to drain")).toEqual({ status: "draining", nats: "connected" });
    expect((await probe(workerHealth, "/healthz")).status).toBe(200);
    expect((await exited(worker)).code, worker.output()).toBe(0);
    expect((await client.getJob(job.id)).state).toBe("succeeded");

    // NATS gone: the dispatcher is still alive, but not ready.
    await nats.server.kill();
    expect(await answers(dispatcherHealth, "/readyz", 503, "the dispatcher to lose NATS")).toEqual({
      status: "ready",
      nats: "disconnected",
    });
    expect((await probe(dispatcherHealth, "/healthz")).status).toBe(200);
  } finally {
    for (const role of roles) role.kill("SIGKILL");
    await Promise.all(roles.map(exited));
    await nats[Symbol.asyncDispose]();
  }
}, 90_000);

test("a --health that is not HOST:PORT is a usage error naming the flag, before anything starts", async () => {
  const nats = await natsFixture();
  try {
    for (const [args, env, named] of [
      [["worker", "--health", "8080"], {}, "--health"],
      [["dispatcher", "--health", "localhost:99999"], {}, "--health"],
      [["dispatcher"], { BOXCAR_HEALTH: "nowhere" }, "BOXCAR_HEALTH"],
    ] as const) {
      const r = await boxcar(nats.url, nats.topology.names.prefix, [...args], env);
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr).toContain(`${named} must be HOST:PORT`);
    }
  } finally {
    await nats[Symbol.asyncDispose]();
  }
}, 60_000);
