import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type BoxcarClient, connectNats, createClient, resolveConnection } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import { ErrorCode, isTerminal } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture, type Scratch, scratch } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker, type Worker } from "@boxcar/worker";
import type { NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

const script = (s: string) => ["sh", "-c", s];
const ok = { command: script('printf \'{"output":null}\' > "$BOXCAR_RESULT_FILE"'), runtime: { sandbox: "host" }, trusted: true };

describe("an admin's policy over agents, a worker's own, and quotas per user", () => {
  let nats: NatsFixture;
  let dir: Scratch;
  let dispatcher: Dispatcher;
  let worker: Worker;
  let admin: BoxcarClient;
  let alice: BoxcarClient;
  let aliceNc: NatsConnection;
  const cli = (...args: string[]) => boxcar(nats.url, nats.topology.names.prefix, args);

  beforeAll(async () => {
    nats = await natsFixture();
    dir = await scratch("boxcar-policy-");
    dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    // This worker lets no agent onto a network, whatever the system's policy says.
    worker = createWorker({
      ...nats.workerRole,
      concurrency: 1,
      providers: [createHostSandboxProvider()],
      policy: { host: "always" },
      agentPolicy: { networks: ["none"] },
    });
    void worker.run();
    admin = createClient(nats.topology);
    await nats.auth.mint("alice", "submitter");
    aliceNc = await connectNats(resolveConnection({ flags: { nats: nats.url, creds: nats.auth.credsFile("alice") }, env: {} }), "alice");
    alice = createClient({ nc: aliceNc, names: nats.topology.names }, { identity: { role: "submitter", user: "alice" } });
  });
  afterAll(async () => {
    await worker?.close();
    await dispatcher?.close();
    await aliceNc?.close();
    await dir?.[Symbol.asyncDispose]();
    await nats?.[Symbol.asyncDispose]();
  });

  test("apply, submission and the worker each refuse what the policy does not allow, naming the field", async () => {
    await admin.applyAgent({ name: "older", ...ok, runtime: { sandbox: "host", network: "sysnet" } });
    const file = join(dir.path, "policy.yaml");
    await writeFile(
      file,
      [
        "agents:",
        "  networks: [none, bridge]",
        '  images: ["localhost/boxcar/*"]',
        "  limits: { memory: 1Gi, timeout: 1h }",
        "quotas:",
        "  default: { queued: 2 }",
      ].join("\n"),
    );
    const set = await cli("policy", "set", "-f", file);
    expect(set.code, set.stderr).toBe(0);
    expect(set.stdout).toContain("agent older does not conform (jobs for it are refused): runtime.network: sysnet is not allowed");
    expect((await admin.getPolicy()).agents.networks).toEqual(["none", "bridge"]);
    // A bad policy names its field under the request's `policy`.
    await expect(admin.setPolicy({ agents: { limits: { memory: "lots" } } } as never)).rejects.toMatchObject({
      code: ErrorCode.invalid,
      issues: [expect.objectContaining({ path: "policy.agents.limits.memory" })],
    });

    for (const [runtime, path] of [
      [{ network: "sysnet" }, "runtime.network"],
      [{ sandbox: "docker", image: "docker.io/evil/miner:latest" }, "runtime.image"],
      [{ limits: { memory: "2Gi" } }, "runtime.limits.memory"],
      [{ timeout: "2h" }, "runtime.timeout"],
    ] as const) {
      const err = await admin.applyAgent({ name: "greedy", ...ok, runtime: { sandbox: "host", ...runtime } }).catch((e: unknown) => e);
      // An issue's path is relative to the request: agents.apply's body is { definition }.
      expect(err, path).toMatchObject({ code: ErrorCode.policyDenied, issues: [expect.objectContaining({ path: `definition.${path}` })] });
    }
    await expect(admin.getAgent("greedy")).rejects.toMatchObject({ code: ErrorCode.notFound });
    const apply = await cli("agent", "apply", "-f", await agentFile("greedy", "    network: sysnet"));
    expect(apply.code).toBe(3);
    expect(apply.stderr).toContain("policy_denied");
    expect(apply.stderr).toContain("runtime.network: sysnet is not allowed (allowed: none, bridge)");
    await expect(
      admin.applyAgent({ name: "fine", ...ok, runtime: { sandbox: "docker", image: "localhost/boxcar/agent:1" } }),
    ).resolves.toBeDefined();

    // Applied before the policy: it stays, but no job for it is admitted.
    // The field at fault is the agent's, not in the request: the issue is the whole body's and names it.
    await expect(alice.submit({ agent: "older" })).rejects.toMatchObject({
      code: ErrorCode.policyDenied,
      issues: [{ path: "", message: "agent older's runtime.network: sysnet is not allowed (allowed: none, bridge)" }],
    });

    // Allowed by the system's policy, refused by this worker's own: it fails unrun.
    await admin.applyAgent({ name: "online", ...ok, runtime: { sandbox: "host", network: "bridge" } });
    // A job's own timeout may not ask for more than the policy allows either.
    await expect(alice.submit({ agent: "online", timeout: "2h" })).rejects.toMatchObject({
      code: ErrorCode.policyDenied,
      issues: [expect.objectContaining({ path: "timeout" })], // the spec's own field
    });
    const { job } = await alice.submit({ agent: "online" });
    const ended = await alice.waitForJob(job.id);
    expect(ended.state).toBe("failed");
    expect(ended.error).toMatchObject({ code: ErrorCode.policyDenied, message: expect.stringContaining("this worker's policy") });
  });

  test("a user with as many jobs waiting as its quota allows is refused until some leave the queue; an admin has no quota", async () => {
    await admin.applyAgent({ name: "sleeper", ...ok, command: script("sleep 30") });
    await admin.applyAgent({ name: "quick", ...ok });
    const mine: string[] = [];
    for (let i = 0; i < 3; i++) mine.push((await alice.submit({ agent: "sleeper" })).job.id);
    // One runs (the worker takes one at a time), two wait: the quota of 2 waiting is reached.
    await eventually(async () => {
      const states = await Promise.all(mine.map(async (id) => (await admin.getJob(id)).state));
      return states.filter((s) => s === "running").length === 1 && states.filter((s) => s === "queued").length === 2 ? true : undefined;
    }, "one job running and two queued");
    const refused = await alice.submit({ agent: "sleeper" }).catch((e: unknown) => e);
    expect(refused).toMatchObject({
      code: ErrorCode.quotaExceeded,
      message: expect.stringContaining("alice has 2 jobs queued and a quota of 2"),
    });
    const cliRefused = await boxcar(nats.url, nats.topology.names.prefix, ["submit", "sleeper"], {
      NATS_CREDS: nats.auth.credsFile("alice"),
    });
    expect(cliRefused.code).toBe(3);
    expect(cliRefused.stderr).toContain("quota_exceeded");
    const byAdmin = await admin.submit({ agent: "sleeper" });
    for (const id of [...mine, byAdmin.job.id]) await admin.cancelJob(id);
    await eventually(
      async () => ((await Promise.all(mine.map((id) => admin.getJob(id)))).every((j) => isTerminal(j.state)) ? true : undefined),
      "cancelled",
    );
    // Room again: the count follows the records.
    await eventually(
      async () =>
        await alice.submit({ agent: "quick" }).then(
          () => true,
          () => undefined,
        ),
      "a new submission is admitted",
    );
  }, 60_000);

  async function agentFile(name: string, runtimeLine: string): Promise<string> {
    const file = join(dir.path, `${name}.yaml`);
    await writeFile(file, [`name: ${name}`, "command: echo hi", "trusted: true", "runtime:", "    sandbox: host", runtimeLine].join("\n"));
    return file;
  }
});
