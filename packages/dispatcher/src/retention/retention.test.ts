import { silentLogger } from "@boxcar/common";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { type JobRecord, PROTOCOL_VERSION } from "@boxcar/protocol";
import { connect } from "@nats-io/transport-node";
import { expect, test } from "vitest";
import { PolicyBook } from "../limits/policy.js";
import { RetentionSweep } from "./retention.js";

// Against a real nats-server. The job-level behaviour (events, output, files) is in test/retention.test.ts.
test("one sweep deletes every job past its retention, however many: batch after batch, and no other", async () => {
  await using server = await startNatsServer();
  const nc = await connect({ servers: server.url });
  try {
    const topology = await openTopology(nc, { prefix: "ret" });
    const policy = await PolicyBook.open(topology, silentLogger);
    // Not started: the test makes the passes itself.
    const sweeper = new RetentionSweep(topology, policy, silentLogger, 3_600_000);
    const ended = (id: string, finishedAt: Date): JobRecord => ({
      v: PROTOCOL_VERSION,
      id,
      agent: "noop",
      pool: "default",
      owner: "local",
      state: "succeeded",
      attempt: 1,
      createdAt: finishedAt.toISOString(),
      finishedAt: finishedAt.toISOString(),
      artifacts: [],
      history: [],
    });
    const old = new Date(Date.now() - 8 * 24 * 3_600_000); // past the default 7 days
    const records = [
      ...Array.from({ length: 1_200 }, (_, i) => ended(`old${i}`, old)),
      ...Array.from({ length: 5 }, (_, i) => ended(`new${i}`, new Date())),
    ];
    for (const record of records) {
      await topology.jobStore.create(record);
      sweeper.observe(record.id, record);
    }
    expect(await sweeper.run()).toBe(1_200);
    const left: string[] = [];
    for await (const key of await topology.jobs.keys()) left.push(key);
    expect(left.sort()).toEqual(["new0", "new1", "new2", "new3", "new4"]);
    await sweeper.stop();
    policy.close();
  } finally {
    await nc.close();
  }
}, 60_000);

test("jobs kept because a job not yet ended uses their files do not hold back the jobs due behind them", async () => {
  await using server = await startNatsServer();
  const nc = await connect({ servers: server.url });
  try {
    const topology = await openTopology(nc, { prefix: "ret2" });
    const policy = await PolicyBook.open(topology, silentLogger);
    const sweeper = new RetentionSweep(topology, policy, silentLogger, 3_600_000);
    const old = new Date(Date.now() - 8 * 24 * 3_600_000).toISOString();
    const record = (id: string, state: JobRecord["state"], files: { path: string; object: string }[]): JobRecord => ({
      v: PROTOCOL_VERSION,
      id,
      agent: "noop",
      pool: "default",
      owner: "local",
      state,
      spec: { v: PROTOCOL_VERSION, agent: "noop", input: null, files, labels: {} },
      attempt: 1,
      createdAt: old,
      ...(state === "queued" ? {} : { finishedAt: old }),
      artifacts: [],
      history: [],
    });
    const shared = [{ path: "data.txt", object: "inputs/local/shared/data.txt" }];
    // More than a batch of ended jobs that share a file with a job still queued, then others.
    const records = [
      record("open", "queued", shared),
      ...Array.from({ length: 550 }, (_, i) => record(`kept${i}`, "succeeded", shared)),
      ...Array.from({ length: 100 }, (_, i) => record(`free${i}`, "succeeded", [])),
    ];
    for (const r of records) {
      await topology.jobStore.create(r);
      sweeper.observe(r.id, r);
    }
    expect(await sweeper.run()).toBe(100);
    const left: string[] = [];
    for await (const key of await topology.jobs.keys()) left.push(key);
    expect(left).toHaveLength(551);
    expect(left.some((k) => k.startsWith("free"))).toBe(false);
    await sweeper.stop();
    policy.close();
  } finally {
    await nc.close();
  }
}, 60_000);
