/**
 * `boxcar run --wait` rides out a dispatcher restart (issue 45, item 8): the run goes on while no
 * dispatcher answers, and the wait asks again instead of giving up (exit 4), from its first read
 * on. Against a real nats-server, a dispatcher stopped and started again mid-run, and a host worker.
 */

import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher as start } from "@boxcar/dispatcher";
import { eventually, natsFixture, scratch } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { expect, test } from "vitest";
import { exited, spawnBoxcar } from "./helpers/cli.js";

/** A nats-server, a host worker and a dispatcher that can be stopped and started again; the agent `nap` sleeps `napS` seconds. */
async function napSystem(napS: number) {
  const nats = await natsFixture();
  let dispatcher: Dispatcher | undefined = await start({ ...nats.dispatcherRole });
  const worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
  void worker.run();
  const client = createClient(nats.topology);
  await client.applyAgent({ name: "nap", command: `sleep ${napS}; echo rested`, trusted: true, runtime: { sandbox: "host" } });
  return {
    nats,
    client,
    async stopDispatcher() {
      await dispatcher?.close();
      dispatcher = undefined;
    },
    async startDispatcher() {
      dispatcher = await start({ ...nats.dispatcherRole });
    },
    async [Symbol.asyncDispose]() {
      await dispatcher?.close();
      await worker[Symbol.asyncDispose]();
      await nats[Symbol.asyncDispose]();
    },
  };
}

test("run --wait outlasts a dispatcher that stops mid-run and starts again: it ends with the run, exit 0", async () => {
  await using system = await napSystem(3);
  const { nats, client } = system;
  await using dir = await scratch("boxcar-run-wait-");
  const file = join(dir.path, "nap.yaml");
  await writeFile(file, "name: nap-run\nsteps:\n  - name: nap\n    agent: nap\n");

  const waiting = spawnBoxcar(nats.url, nats.topology.names.prefix, ["run", file, "--wait"]);
  try {
    await eventually(async () => {
      const [run] = await client.listRuns({ workflow: "nap-run" });
      return run?.steps.nap?.instances[0]?.state === "running" ? run : undefined;
    }, "the run's step to run");
    // No dispatcher while the step ends: the wait's reads meet nobody for a while.
    await system.stopDispatcher();
    await new Promise((r) => setTimeout(r, 6_000));
    await system.startDispatcher();
    const { code } = await exited(waiting);
    expect(code, waiting.output()).toBe(0);
    const [run] = await client.listRuns({ workflow: "nap-run" });
    expect(run?.state).toBe("succeeded");
  } finally {
    waiting.kill("SIGKILL");
  }
});

test("a wait that begins while no dispatcher answers asks again until one does: for a run, a chain, and boxcar status --wait", async () => {
  await using system = await napSystem(2);
  const { nats, client } = system;
  const { run } = await client.startRun({ workflow: { name: "nap-run", steps: [{ name: "nap", agent: "nap" }] } });
  const { job } = await client.submit({ agent: "nap" });
  await system.stopDispatcher();
  // Their first reads meet nobody (CI saw `run --wait` exit 4 when its first read came just after a dispatcher stopped).
  const waits = Promise.all([client.waitForRun(run.id), client.waitForChain(job.id)]);
  const status = spawnBoxcar(nats.url, nats.topology.names.prefix, ["status", job.id, "--wait"]);
  await new Promise((r) => setTimeout(r, 3_000));
  await system.startDispatcher();
  const [ran, chained] = await waits;
  expect(ran.state).toBe("succeeded");
  expect(chained).toMatchObject({ id: job.id, state: "succeeded" });
  expect((await exited(status)).code, status.output()).toBe(0);
});
