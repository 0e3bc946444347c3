import { silentLogger } from "@boxcar/common";
import { natsTestServer } from "@boxcar/fabric/testing";
import { expect, test } from "vitest";
import { IndexSnapshots } from "./index-snapshots.js";
import { JobIndex } from "./job-index.js";

// Against a real nats-server.
test("markers are covered up to a snapshot known for the grace, never past a starting dispatcher's lease; a write keeps the snapshot before it", async () => {
  await using nats = await natsTestServer();
  const topology = await nats.topology();
  const lastSeq = async () => (await topology.jsm.streams.info(`KV_${topology.names.buckets.jobs}`)).state.last_seq;
  let at: number | undefined;
  const writer = new IndexSnapshots(
    topology,
    new JobIndex(),
    () => at,
    () => [["gone", 1]],
    silentLogger,
    0,
    0,
  );
  /** Another dispatcher's, which writes none, knowing a snapshot for `graceMs` before it covers. */
  const other = (graceMs: number) =>
    new IndexSnapshots(
      topology,
      new JobIndex(),
      () => undefined,
      () => [],
      silentLogger,
      0,
      graceMs,
    );
  const written = async () => {
    await topology.jobs.put(`k${await lastSeq()}`, "{}");
    at = await lastSeq();
    expect(await writer.write()).toBe(true);
    return at;
  };
  const first = await written();
  expect(await writer.coveredSeq()).toBe(first);

  // A dispatcher starts from it: its lease holds the markers past it, though newer snapshots come.
  const starter = other(0);
  const from = await starter.restore();
  expect(from).toMatchObject({ seq: first, markers: [["gone", 1]], settled: 0 });
  const second = await written();
  const third = await written();
  expect(await writer.coveredSeq()).toBe(first);
  const names = async () => (await (await topology.jobIndex()).list()).map((i) => i.name).filter((n) => n.startsWith("jobs-"));
  // The one before the newest stays (a start may be reading it); older ones go.
  expect(await names()).toEqual([second, third].map((seq) => `jobs-${String(seq).padStart(16, "0")}`));
  await starter.release();
  expect(await writer.coveredSeq()).toBe(third);

  // Another dispatcher knows the newest only from now: not covered until it has known it for its grace.
  const patient = other(60_000);
  expect(await patient.coveredSeq()).toBe(0);
});
