import { type JobRecord, SystemPolicy } from "@boxcar/protocol";
import { expect, test } from "vitest";
import { JobLoad } from "./policy.js";

const job = (id: string, state: JobRecord["state"], owner = "alice") => ({ id, owner, state }) as JobRecord;

test("the queue's jobs and bytes follow each record's latest state, and new work is refused at either limit", () => {
  const load = new JobLoad();
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
