import { silentLogger } from "@boxcar/client";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { type JobRecord, PROTOCOL_VERSION } from "@boxcar/protocol";
import { connect } from "@nats-io/transport-node";
import { expect, test } from "vitest";
import { PolicyBook } from "./policy.js";
import { RetentionSweeper } from "./retention.js";

// Against a real nats-server. The job-level behaviour (events, output, files) is in test/retention.test.ts.
test("one sweep deletes every job past its retention, however many: batch after batch, and no other", async () => {
  await using server = await startNatsServer();
  const nc = await connect({ servers: server.url });
  try {
    const topology = await openTopology(nc, { prefix: "ret" });
    const policy = await PolicyBook.open(topology, silentLogger);
    // An interval that never comes: the test calls the sweep itself.
    const sweeper = new RetentionSweeper(topology, policy, silentLogger, 3_600_000);
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
    expect(await sweeper.sweep()).toBe(1_200);
    const left: string[] = [];
    for await (const key of await topology.jobs.keys()) left.push(key);
    expect(left.sort()).toEqual(["new0", "new1", "new2", "new3", "new4"]);
    await sweeper.close();
    policy.close();
  } finally {
    await nc.close();
  }
}, 60_000);
