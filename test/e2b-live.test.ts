import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { BoxcarEvent, SandboxEvent } from "@boxcar/protocol";
import { type NatsFixture, natsFixture } from "@boxcar/testing";
// The provider is not exported from @boxcar/worker yet: use the built module directly.
import { createE2BSandboxProvider, createWorker, type Worker } from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";

/**
 * One job and one session against the real E2B, when the environment has a key (and,
 * optionally, E2B_DOMAIN for a self-hosted E2B and E2B_TEMPLATE for another template than
 * `base`). It costs a few seconds of two small sandboxes.
 */
const apiKey = process.env.E2B_API_KEY;
if (!apiKey) {
  // biome-ignore lint/suspicious/noConsole: a skipped live test says why, once.
  console.info("e2b-live.test.ts: skipped, E2B_API_KEY is not set (set it to run a job and a session in a real E2B sandbox)");
}

let nats: NatsFixture;
let dispatcher: Dispatcher;
let worker: Worker;
let client: BoxcarClient;

describe.skipIf(!apiKey)("E2B sandboxes (real E2B)", () => {
  beforeAll(async () => {
    nats = await natsFixture();
    dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    worker = createWorker({
      ...nats.workerRole,
      providers: [createE2BSandboxProvider({ apiKey, domain: process.env.E2B_DOMAIN, prefix: nats.topology.names.prefix })],
    });
    void worker.run();
    client = createClient(nats.topology);
  });
  afterAll(async () => {
    await worker?.close();
    await dispatcher?.close();
    await nats?.[Symbol.asyncDispose]();
  });

  test("a job runs in a real E2B sandbox: input in, output and an artifact out, the sandbox killed", { timeout: 180_000 }, async () => {
    await client.applyAgent({
      name: "live",
      command: [
        "bash",
        "-c",
        'mkdir -p out && tr a-z A-Z < "$BOXCAR_INPUT_FILE" > out/upper.json && echo "hello from $(uname -s)" && printf \'{"output":{"pwd":"%s","internet":"%s"}}\' "$PWD" "$( (timeout 5 bash -c "exec 3<>/dev/tcp/1.1.1.1/53" && echo yes) 2>/dev/null || echo no)" > "$BOXCAR_RESULT_FILE"',
      ],
      runtime: { sandbox: "e2b", timeout: "2m", ...(process.env.E2B_TEMPLATE ? { template: process.env.E2B_TEMPLATE } : {}) },
    });
    const { job } = await client.submit({ agent: "live", input: { greeting: "hi" } });
    const final = await client.waitForJob(job.id);
    const events: BoxcarEvent[] = [];
    for await (const e of client.events(job.id)) events.push(e);
    let logs = "";
    for await (const chunk of client.logs(job.id)) logs += new TextDecoder().decode(chunk.data);

    expect(final.error).toBeUndefined();
    expect(final.state).toBe("succeeded");
    expect(final.result?.output).toEqual({ pwd: "/home/user/workspace", internet: "no" });
    expect(logs).toContain("hello from Linux");
    const upper = await nats.topology.artifacts.getBlob(`${job.id}/out/upper.json`);
    expect(new TextDecoder().decode(upper ?? new Uint8Array())).toBe('{"GREETING":"HI"}');
    const sandboxEvents = events.filter((e): e is SandboxEvent => e.kind === "sandbox");
    expect(sandboxEvents.map((e) => e.type)).toEqual(["creating", "ready", "exec_started", "exec_exited", "destroyed"]);
    expect(sandboxEvents.find((e) => e.type === "ready")).toMatchObject({ backend: "e2b", network: "none" });
    expect(JSON.stringify(events) + logs + JSON.stringify(final)).not.toContain(apiKey);
  });

  test("a session in a real E2B sandbox: a command with stdin in a folder, a file each way, a snapshot, closed", {
    timeout: 180_000,
  }, async () => {
    await client.applyAgent({
      name: "live-session",
      command: ["true"],
      sessions: true,
      runtime: { sandbox: "e2b", timeout: "2m", ...(process.env.E2B_TEMPLATE ? { template: process.env.E2B_TEMPLATE } : {}) },
    });
    const session = await client.openSession({ agent: "live-session", maxLifetime: "30m" });
    try {
      await client.writeSessionFile(session.id, "in/a.txt", "written\n");
      const ran = await client.execInSession({
        id: session.id,
        argv: ["sh", "-c", "cat a.txt; tr a-z A-Z; pwd > ../where.txt"],
        cwd: "in",
        stdin: Buffer.from("piped\n").toString("base64"),
      });
      expect(ran.exitCode).toBe(0);
      expect(Buffer.from(ran.stdout, "base64").toString()).toBe("written\nPIPED\n");
      expect(Buffer.from(await client.readSessionFile(session.id, "where.txt")).toString()).toBe("/home/user/workspace/in\n");
      const snapshot = await client.snapshotSession(session.id);
      expect(snapshot.size).toBeGreaterThan(0);
      await client.removeSnapshot(snapshot.id);
    } finally {
      await client.closeSession(session.id);
    }
  });
});
