import { eventually, type NatsCluster, natsCluster, uniquePrefix } from "@boxcar/testing";
import { afterAll, beforeAll, expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { answers, healthOf, probe } from "./helpers/health.js";

let cluster: NatsCluster;

/** A dispatcher and a host worker as `boxcar` processes on the first server, stopped (and every server resumed) after `body`. */
async function withRoles(
  prefix: string,
  body: (roles: { url: string; dispatcher: ReturnType<typeof spawnBoxcar>; worker: ReturnType<typeof spawnBoxcar> }) => Promise<void>,
): Promise<void> {
  const url = cluster.urls[0] as string; // the server that stays up; the roles connect to it
  const dispatcher = spawnBoxcar(url, prefix, ["dispatcher", "--health", "127.0.0.1:0"]);
  const worker = spawnBoxcar(url, prefix, ["worker", "--host", "always", "--health", "127.0.0.1:0"]);
  try {
    await body({ url, dispatcher, worker });
  } finally {
    cluster.resume(1);
    cluster.resume(2);
    dispatcher.kill("SIGTERM");
    worker.kill("SIGTERM");
    await Promise.all([exited(dispatcher), exited(worker)]);
  }
}

beforeAll(async () => {
  cluster = await natsCluster(3);
}, 240_000); // natsCluster may start the cluster again
afterAll(async () => {
  await cluster?.[Symbol.asyncDispose]();
});

test("a dispatcher and a worker started while the cluster has no meta leader wait for it, saying so once per step, then work", async () => {
  const prefix = uniquePrefix();
  // Two of three servers frozen: no quorum, so no meta leader and no JetStream answer.
  cluster.pause(1);
  cluster.pause(2);
  await withRoles(prefix, async ({ url, dispatcher, worker }) => {
    await eventually(
      async () => (/JetStream does not answer yet; waiting/.test(dispatcher.output() + worker.output()) ? true : undefined),
      "a role to say it waits",
    );
    await new Promise((r) => setTimeout(r, 5_000));
    expect(dispatcher.exitCode, dispatcher.output()).toBeNull();
    expect(worker.exitCode, worker.output()).toBeNull();
    // Waiting is alive but not ready: a probe neither restarts the role nor sends it traffic.
    const health = await Promise.all([healthOf(dispatcher), healthOf(worker)]);
    for (const base of health) {
      expect((await probe(base, "/healthz")).status).toBe(200);
      expect(await probe(base, "/readyz")).toEqual({ status: 503, body: '{"status":"starting","nats":"connected"}\n' });
    }
    cluster.resume(1);
    cluster.resume(2);
    await eventually(
      async () => (dispatcher.output().includes("dispatcher started") ? true : undefined),
      "the dispatcher to start",
      60_000,
    );
    await eventually(async () => (worker.output().includes("worker started") ? true : undefined), "the worker to start", 60_000);
    for (const base of health)
      expect(await answers(base, "/readyz", 200, "the role to be ready")).toEqual({ status: "ready", nats: "connected" });
    // Each step that waits says so once, however long it waits.
    for (const role of [dispatcher, worker]) {
      const waits = role.output().match(/"msg":"[^"]*: JetStream does not answer yet/g) ?? [];
      expect(new Set(waits).size, role.output()).toBe(waits.length);
    }
    const agent = await boxcar(url, prefix, ["agent", "apply", "-f", "examples/agents/hello.yaml"]);
    expect(agent.code, agent.stderr).toBe(0);
    const job = await boxcar(url, prefix, ["submit", "hello", "--wait", "--json"]);
    expect(JSON.parse(job.stdout).state, job.stderr).toBe("succeeded");
  });
}, 120_000);

test("a role told to stop (SIGTERM) while it waits for a cluster with no meta leader stops at once, cleanly", async () => {
  const prefix = uniquePrefix();
  const url = cluster.urls[0] as string;
  cluster.pause(1);
  cluster.pause(2);
  const roles = [spawnBoxcar(url, prefix, ["dispatcher"]), spawnBoxcar(url, prefix, ["worker", "--host", "always"])];
  try {
    for (const role of roles) {
      await eventually(async () => (/JetStream does not answer yet; waiting/.test(role.output()) ? true : undefined), "the role to wait");
      role.kill("SIGTERM");
      // It exits while the cluster still has no leader (resumed only after), not when it comes back.
      expect((await exited(role)).code, role.output()).toBe(0);
      expect(role.output()).toContain("stopped before it started");
    }
  } finally {
    cluster.resume(1);
    cluster.resume(2);
    for (const role of roles) role.kill("SIGKILL");
  }
}, 90_000);

test("running roles ride out a cluster that loses its meta leader and stream leaders mid-run: every job ends succeeded, no role exits", async () => {
  const prefix = uniquePrefix();
  await withRoles(prefix, async ({ url, dispatcher, worker }) => {
    await eventually(async () => (worker.output().includes("worker started") ? true : undefined), "the worker to start", 60_000);
    await eventually(async () => ((await boxcar(url, prefix, ["workers"])).code === 0 ? true : undefined), "a dispatcher to answer");
    const agent = await boxcar(url, prefix, ["agent", "apply", "-f", "examples/agents/hello.yaml"]);
    expect(agent.code, agent.stderr).toBe(0);
    const submitted: string[] = [];
    const submitSome = async (n: number) => {
      for (let i = 0; i < n; i++) {
        const r = await boxcar(url, prefix, ["submit", "hello", "--json"]);
        if (r.code === 0) submitted.push(JSON.parse(r.stdout).job.id);
      }
    };
    await submitSome(5);
    // Two of three servers frozen for a while: the streams (3 replicas) lose their leaders and quorum.
    cluster.pause(1);
    cluster.pause(2);
    await new Promise((r) => setTimeout(r, 6_000));
    cluster.resume(1);
    cluster.resume(2);
    await submitSome(5);
    expect(submitted.length).toBeGreaterThanOrEqual(10);
    for (const id of submitted) {
      const status = await eventually(
        async () => {
          const r = await boxcar(url, prefix, ["status", id, "--wait", "--json"]);
          return r.code === 0 ? JSON.parse(r.stdout) : undefined;
        },
        `job ${id} to end`,
        60_000,
      );
      expect(status.state, id).toBe("succeeded");
    }
    expect(dispatcher.exitCode, dispatcher.output()).toBeNull();
    expect(worker.exitCode, worker.output()).toBeNull();
  });
}, 180_000);
