import { natsFixture } from "@boxcar/testing";
import { expect, test } from "vitest";

test("a fixture server provides the topology: streams, buckets and object store", async () => {
  await using nats = await natsFixture();
  const streams = await nats.topology.jsm.streams.names().next();
  expect(streams).toEqual(expect.arrayContaining(Object.values(nats.topology.names.streams)));
  await nats.topology.jobs.put("k", "v");
  expect((await nats.topology.jobs.get("k"))?.string()).toBe("v");
});
