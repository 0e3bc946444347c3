import { natsTestServer } from "@boxcar/fabric/testing";
import { expect, test } from "vitest";
import { replayBucket } from "./bucket-replay.js";

// Against a real nats-server.
test("a replay after a sequence shows what was written after it, and is over at once when nothing is, though the stream's last messages were removed", async () => {
  await using nats = await natsTestServer();
  const topology = await nats.topology();
  const stream = `KV_${topology.names.buckets.jobs}`;
  // As a replicated bucket is: no direct gets.
  const { config } = await topology.jsm.streams.info(stream);
  await topology.jsm.streams.update(stream, { ...config, allow_direct: false });
  for (const key of ["a", "b", "c"]) await topology.jobs.put(key, "{}");
  // Written then removed by sequence, as a job's delete marker is: the stream's last sequence, never shown.
  await topology.jobs.put("gone", "{}");
  const gone = await topology.jsm.streams.getMessage(stream, { last_by_subj: `$KV.${topology.names.buckets.jobs}.gone` });
  await topology.jsm.streams.deleteMessage(stream, gone?.seq as number, false);

  const shown: string[] = [];
  const after2 = await replayBucket(topology, "jobs", (entry) => shown.push(entry.key), 2);
  await after2.caughtUp;
  expect(shown).toEqual(["c"]);
  after2.stop();

  const none = await replayBucket(topology, "jobs", (entry) => shown.push(entry.key), 3);
  await none.caughtUp;
  expect(shown).toEqual(["c"]);
  // Then it follows what comes.
  await topology.jobs.put("d", "{}");
  await expect.poll(() => shown).toEqual(["c", "d"]);
  none.stop();
});
