import { type JobRecord, SystemPolicy } from "@boxcar/protocol";
import { expect, test } from "vitest";
import { JobIndex } from "../jobs/job-index.js";
import { JobLoad } from "./policy.js";

const job = (id: string, state: JobRecord["state"], owner = "alice", artifacts: number[] = []) =>
  ({
    id,
    owner,
    state,
    artifacts: artifacts.map((size, i) => ({ path: `out/${i}`, object: `${id}/${i}`, size, sha256: "" })),
  }) as JobRecord;

test("the queue's jobs and bytes follow each record's latest state, and new work is refused at either limit", () => {
  const load = new JobLoad(new JobIndex());
  const policy = SystemPolicy.parse({ queue: { jobs: 3, bytes: "1Mi" } });
  load.observe("a", job("a", "queued"), 1_000);
  load.observe("b", job("b", "queued", "bob"), 2_000);
  load.observe("a", job("a", "queued"), 1_000); // seen again (the watch after the admission): counted once
  expect(load.queued).toEqual({ jobs: 2, bytes: 3_000 });
  load.checkRoom(policy);

  load.observe("c", job("c", "accepted"), 500);
  expect(() => load.checkRoom(policy)).toThrow(
    /the queue is full: 3 jobs \(3 KiB\) wait to start, and the system policy allows 3 jobs or 1 MiB/,
  );

  load.observe("a", job("a", "running"), 1_200); // started: no longer waiting
  expect(load.queued).toEqual({ jobs: 2, bytes: 2_500 });
  expect(load.of("alice")).toEqual({ queued: 1, running: 1 });
  load.checkRoom(policy);

  load.observe("d", job("d", "queued"), 1024 ** 2); // one big record fills the bytes
  expect(() => load.checkRoom(policy)).toThrow(expect.objectContaining({ code: "queue_full" }));
  load.observe("d", undefined); // withdrawn or deleted
  load.observe("b", job("b", "succeeded", "bob"), 2_100);
  expect(load.queued).toEqual({ jobs: 1, bytes: 500 });
  expect(load.of("bob")).toEqual({ queued: 0, running: 0 });
  load.checkRoom(SystemPolicy.parse({})); // the defaults: 100000 jobs, 256 MiB
});

test("the bytes kept of each user's jobs (records and artifacts, every job not deleted) and of artifacts in all follow each record, and new jobs are refused at the quotas", () => {
  const load = new JobLoad(new JobIndex());
  const policy = SystemPolicy.parse({ quotas: { default: { bytes: "100Ki" }, users: { bob: {} }, artifacts: "150Ki" } });
  const alice = { user: "alice", role: "submitter" } as const;
  const bob = { user: "bob", role: "submitter" } as const;
  load.observe("a", job("a", "queued"), 10_000);
  load.observe("a", job("a", "succeeded", "alice", [40_000, 20_000]), 11_000); // ended with two artifacts: still kept
  load.observe("b", job("b", "failed", "bob", [70_000]), 5_000);
  expect([load.storedOf("alice"), load.storedOf("bob"), load.artifacts]).toEqual([71_000, 75_000, 130_000]);
  load.check(alice, policy);
  load.checkRoom(policy);

  load.observe("c", job("c", "queued"), 32_000); // alice keeps 103 000 bytes: past her 100 KiB
  expect(() => load.check(alice, policy)).toThrow(
    expect.objectContaining({ code: "storage_quota_exceeded", message: expect.stringContaining("alice's jobs keep 101 KiB") }),
  );
  load.check(bob, policy); // bob's own quota sets no bytes
  load.check({ user: "alice", role: "admin" }, policy); // admins have none

  load.observe("c", job("c", "succeeded", "alice", [30_000]), 33_000); // artifacts in all: 160 000, past 150 KiB
  expect(() => load.checkRoom(policy)).toThrow(
    expect.objectContaining({ code: "storage_quota_exceeded", message: expect.stringContaining("the system keeps 156 KiB of artifacts") }),
  );
  load.observe("a", undefined); // deleted
  expect([load.storedOf("alice"), load.artifacts]).toEqual([63_000, 100_000]);
  load.check(alice, policy);
  load.checkRoom(policy);
});
