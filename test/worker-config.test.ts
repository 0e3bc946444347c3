import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { eventually, natsFixture, scratch } from "@boxcar/testing";
import { expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";

test("a worker config file sets the worker up; flags override it; the worker advertises the result", async () => {
  await using nats = await natsFixture();
  await using _d = await startDispatcher({ ...nats.dispatcherRole });
  await using folder = await scratch("boxcar-config-");
  const dir = folder.path;
  const config = join(dir, "worker.yaml");
  await writeFile(
    config,
    [
      "pools: [gpu, default]",
      "concurrency: 2",
      "heartbeat: 1s",
      "idleHeartbeat: 2500ms",
      "sandbox:",
      "  allowed: [host]",
      "  host: always",
      "  docker:",
      "    image: x:1",
    ].join("\n"),
  );
  const child = spawnBoxcar(nats.url, nats.topology.names.prefix, ["worker", "--config", config, "--concurrency", "3"]);
  try {
    const client = createClient(nats.topology);
    const [info] = await eventually(async () => {
      const list = await client.listWorkers();
      return list.length === 1 ? list : undefined;
    }, "the worker to advertise itself");
    expect(info).toMatchObject({
      pools: ["gpu", "default"],
      capacity: 3, // the flag wins over the file's 2
      heartbeatMs: 2500, // idle: its idle heartbeat, from the file
      policy: { allowed: ["host"], host: "always" },
    });
    // host: always lets an untrusted agent run on the host
    await client.applyAgent({ name: "plain", command: "echo plain", pool: "gpu" });
    const { job } = await client.submit({ agent: "plain" });
    expect((await client.waitForJob(job.id)).state).toBe("succeeded");
  } finally {
    child.kill("SIGTERM");
    await exited(child);
  }
});

test("a bad worker config file or flag is a usage error that names the place", async () => {
  await using nats = await natsFixture();
  await using folder = await scratch("boxcar-config-");
  const dir = folder.path;
  const config = join(dir, "worker.yaml");
  await writeFile(config, "concurrency: lots\nsandbox:\n  host: sometimes\n  dockr: {}\n");
  const bad = await boxcar(nats.url, nats.topology.names.prefix, ["worker", "--config", config]);
  expect(bad.code).toBe(2);
  expect(bad.stderr).toContain(`${config}:1:1: concurrency:`);
  expect(bad.stderr).toContain(`${config}:3:3: sandbox.host:`);
  expect(bad.stderr).toContain(`${config}:4:3: sandbox.dockr: unknown field`);

  const flag = await boxcar(nats.url, nats.topology.names.prefix, ["worker", "--sandboxes", "host,vm"]);
  expect(flag.code).toBe(2);
  expect(flag.stderr).toContain('--sandboxes: "vm" is not one of host, docker, e2b');
  const missing = await boxcar(nats.url, nats.topology.names.prefix, ["worker", "--config", join(dir, "nope.yaml")]);
  expect(missing.code).toBe(2);
  expect(missing.stderr).toContain("cannot read worker config");
});
