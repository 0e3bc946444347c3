import { setTimeout as sleep } from "node:timers/promises";
import { silentLogger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { type NatsTestServer, natsTestServer } from "@boxcar/fabric/testing";
import { PROTOCOL_VERSION, RuntimePolicy, type WorkerInfo } from "@boxcar/protocol";
import { afterAll, beforeAll, expect, test } from "vitest";
import { WorkerDirectory } from "./worker-directory.js";

// Against a real nats-server: the directory is a watch of the workers bucket.
let nats: NatsTestServer;
let topology: Topology;

beforeAll(async () => {
  nats = await natsTestServer();
  topology = await nats.topology();
});
afterAll(async () => {
  await nats?.close();
});

/** A worker's presence, heartbeating every second, last at `heartbeatAt`. */
const presence = (id: string, heartbeatAt: Date): WorkerInfo => ({
  v: PROTOCOL_VERSION,
  id,
  host: "h",
  pid: 1,
  pools: ["default"],
  sandboxes: ["host"],
  policy: RuntimePolicy.parse({}),
  capacity: 1,
  load: 0,
  jobs: [],
  state: "running",
  startedAt: heartbeatAt.toISOString(),
  heartbeatAt: heartbeatAt.toISOString(),
  heartbeatMs: 1_000,
});

async function until(done: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !done(); i++) await sleep(10);
  expect(done()).toBe(true);
}

test("workers that come and go are forgotten once gone, and known again when they heartbeat", async () => {
  const directory = await WorkerDirectory.open(topology, silentLogger);
  try {
    // 200 autoscaled workers that each heartbeated once and went (their entries stay: 2.10 sends no delete on expiry).
    const now = Date.now();
    await topology.workers.put("steady", JSON.stringify(presence("steady", new Date(now))));
    for (let i = 0; i < 200; i++) await topology.workers.put(`w${i}`, JSON.stringify(presence(`w${i}`, new Date(now))));
    await until(() => directory.size === 201);

    // Five seconds on (more than 3 missed heartbeats), "steady" has heartbeated again; the others have not.
    const later = now + 5_000;
    await topology.workers.put("steady", JSON.stringify(presence("steady", new Date(later))));
    await sleep(50);
    directory.forgetGone(later);
    expect(directory.size).toBe(1);

    // One of them comes back.
    await topology.workers.put("w7", JSON.stringify(presence("w7", new Date())));
    await until(() => directory.size === 2);
  } finally {
    await directory.close();
  }
});

test("version 2 work items only while every live worker reads them: a worker of an earlier release, live, holds them back", async () => {
  const topology = await nats.topology();
  const directory = await WorkerDirectory.open(topology, silentLogger);
  try {
    // No worker yet: any that comes and cannot read an item hands it back, so nothing holds them back.
    expect(directory.allRead(2)).toBe(true);
    const reads = (id: string, heartbeatAt: Date) => ({ ...presence(id, heartbeatAt), workItems: [1, 2] });
    await topology.workers.put("new", JSON.stringify(reads("new", new Date())));
    await until(() => directory.size === 1);
    expect(directory.allRead(2)).toBe(true);

    // A worker of an earlier release says nothing of the versions it reads: 1 only.
    await topology.workers.put("old", JSON.stringify(presence("old", new Date())));
    await until(() => directory.size === 2);
    expect([directory.allRead(1), directory.allRead(2)]).toEqual([true, false]);

    // Once it has stopped (or gone quiet), only the live ones count.
    await topology.workers.put("old", JSON.stringify({ ...presence("old", new Date()), state: "stopped" }));
    await until(() => directory.allRead(2));
    await topology.workers.put("old", JSON.stringify(presence("old", new Date())));
    await until(() => !directory.allRead(2));
    await topology.workers.put("old", JSON.stringify(presence("old", new Date(Date.now() - 60_000))));
    await until(() => directory.allRead(2));
  } finally {
    await directory.close();
  }
});
