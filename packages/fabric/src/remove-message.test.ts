import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import { afterAll, beforeAll, expect, test } from "vitest";
import { removeMessage } from "./remove-message.js";
import { type NatsTestServer, natsTestServer } from "./testing.js";
import type { Topology } from "./topology.js";

let nats: NatsTestServer;
let topology: Topology;
beforeAll(async () => {
  // The test's own connection may do anything; user "old" is refused deletes by sequence, as a
  // dispatcher's credential made before they were allowed.
  nats = await natsTestServer({
    extraConfig: [
      "authorization { users: [",
      "  { user: all, password: all },",
      '  { user: old, password: old, permissions: { publish: { allow: [">"], deny: ["$JS.API.STREAM.MSG.DELETE.>"] } } }',
      "] }",
      "no_auth_user: all",
    ].join("\n"),
  });
  topology = await nats.topology();
});
afterAll(() => nats?.close());

test("a revision goes by its sequence; one replaced or gone already is not there; a later one stays", async () => {
  const stream = `KV_${topology.names.buckets.jobs}`;
  const subject = (key: string) => `$KV.${topology.names.buckets.jobs}.${key}`;
  const first = await topology.jobs.put("a", "1");
  const second = await topology.jobs.put("a", "2"); // the bucket keeps one a key: the first is gone
  expect(await removeMessage(topology.jsm, stream, subject("a"), first)).toBe(false);
  expect((await topology.jobs.get("a"))?.string()).toBe("2");
  expect(await removeMessage(topology.jsm, stream, subject("a"), second)).toBe(true);
  expect(await topology.jobs.get("a")).toBeNull();
  expect(await removeMessage(topology.jsm, stream, subject("a"), second)).toBe(false);
});

test("a credential refused deletes by sequence purges up to the sequence instead", async () => {
  const stream = `KV_${topology.names.buckets.jobs}`;
  const subject = `$KV.${topology.names.buckets.jobs}.b`;
  const nc = await connect({ servers: nats.url, user: "old", pass: "old" });
  try {
    const jsm = await jetstreamManager(nc);
    await expect(jsm.streams.deleteMessage(stream, 1, false)).rejects.toThrow(/Permissions Violation/);
    const first = await topology.jobs.put("b", "1");
    expect(await removeMessage(jsm, stream, subject, first)).toBe(true);
    expect(await topology.jobs.get("b")).toBeNull();
    const again = await topology.jobs.put("b", "2");
    await topology.jobs.put("b", "3");
    expect(await removeMessage(jsm, stream, subject, again)).toBe(false); // a later one stays
    expect((await topology.jobs.get("b"))?.string()).toBe("3");
  } finally {
    await nc.close();
  }
});

test("in a bucket made to keep 5 revisions a key (as before), the revision and every earlier one go, by a purge", async () => {
  const kv = await new Kvm(nats.nc).create(`${topology.names.prefix}_five`, { history: 5 });
  const stream = `KV_${topology.names.prefix}_five`;
  const subject = `$KV.${topology.names.prefix}_five.c`;
  await kv.put("c", "queued");
  const read = await kv.put("c", "succeeded");
  const held = async () => (await topology.jsm.streams.info(stream, { subjects_filter: subject })).state.messages;
  expect(await held()).toBe(2);
  // A delete by sequence would leave the first revision, and a read would find the job again.
  expect(await removeMessage(topology.jsm, stream, subject, read)).toBe(true);
  expect(await held()).toBe(0);
  expect(await kv.get("c")).toBeNull();
});
