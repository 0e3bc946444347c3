import { describe, expect, test } from "vitest";
import { PROTOCOL_VERSION } from "./agent.js";
import { JobRecord } from "./job.js";
import { RuntimePolicy } from "./runtime.js";
import { inFlightFate, WorkerInfo, WorkerView, workerViews } from "./worker-info.js";
import { isLive, workerStatus } from "./worker-status.js";

const NOW = Date.parse("2030-01-01T00:00:10.000Z");
const at = (msAgo: number) => new Date(NOW - msAgo).toISOString();

function worker(over: Partial<WorkerInfo> = {}): WorkerInfo {
  return WorkerInfo.parse({
    v: PROTOCOL_VERSION,
    id: "w-a",
    host: "h",
    pid: 1,
    pools: ["default"],
    sandboxes: ["host"],
    policy: RuntimePolicy.parse({}),
    capacity: 4,
    load: 0,
    jobs: [],
    state: "running",
    startedAt: at(60_000),
    heartbeatAt: at(0),
    heartbeatMs: 1_000,
    ...over,
  });
}

function record(over: Partial<JobRecord>): JobRecord {
  return JobRecord.parse({
    v: PROTOCOL_VERSION,
    id: "j1",
    agent: "a",
    pool: "default",
    state: "queued",
    attempt: 0,
    createdAt: at(5_000),
    ...over,
  });
}

describe("workerStatus", () => {
  // state × heartbeat age (heartbeat every 1 s, so gone after 3 s of silence) → status
  const rows: [WorkerInfo["state"], number, string][] = [
    ["running", 0, "live"],
    ["running", 3_000, "live"],
    ["running", 3_001, "gone"],
    ["draining", 2_000, "draining"],
    ["draining", 10_000, "gone"],
    ["stopped", 0, "stopped"],
    ["stopped", 600_000, "stopped"],
  ];
  test.each(rows)("%s, last heartbeat %i ms ago: %s", (state, ago, expected) => {
    const info = worker({ state, heartbeatAt: at(ago) });
    expect(workerStatus(info, NOW)).toBe(expected);
    expect(isLive(info, NOW)).toBe(expected === "live" || expected === "draining");
  });

  test("the bound follows each worker's own heartbeat interval", () => {
    expect(workerStatus(worker({ heartbeatMs: 5_000, heartbeatAt: at(14_000) }), NOW)).toBe("live");
    expect(workerStatus(worker({ heartbeatMs: 5_000, heartbeatAt: at(16_000) }), NOW)).toBe("gone");
  });
});

describe("inFlightFate: what became of a gone worker's job", () => {
  const rows: [string, JobRecord | undefined, string, RegExp][] = [
    ["no record", undefined, "missing", /no record/],
    ["still running under the gone worker", record({ state: "running", attempt: 1, workerId: "w-a" }), "awaiting_redelivery", /lease/],
    [
      "claimed by another worker",
      record({ state: "running", attempt: 2, workerId: "w-b" }),
      "running_elsewhere",
      /^running on w-b as attempt 2$/,
    ],
    ["handed back", record({ state: "queued", attempt: 1 }), "queued", /^queued again after attempt 1/],
    ["finished elsewhere", record({ state: "succeeded", attempt: 2, workerId: "w-b" }), "finished", /^succeeded on w-b as attempt 2$/],
    ["finished before the worker went", record({ state: "failed", attempt: 1, workerId: "w-a" }), "finished", /^failed on this worker/],
  ];
  test.each(rows)("%s", (_what, job, fate, summary) => {
    const found = inFlightFate("j1", "w-a", job);
    expect(found.fate).toBe(fate);
    expect(found.summary).toMatch(summary);
  });
});

describe("workerViews", () => {
  test("sorts by status, accounts for gone workers' jobs only, and looks each job up once", async () => {
    const looked: string[] = [];
    const records: Record<string, JobRecord> = {
      j1: record({ id: "j1", state: "running", attempt: 2, workerId: "w-live" }),
      j2: record({ id: "j2", state: "succeeded", attempt: 1, workerId: "w-gone" }),
    };
    const views = await workerViews(
      [
        worker({ id: "w-gone", jobs: ["j1", "j2"], load: 2, heartbeatAt: at(60_000) }),
        worker({ id: "w-gone2", jobs: ["j1"], load: 1, heartbeatAt: at(60_000) }),
        worker({ id: "w-drain", state: "draining", jobs: ["j3"], load: 1 }),
        worker({ id: "w-live", jobs: ["j1"], load: 1 }),
      ],
      async (id) => {
        looked.push(id);
        return records[id];
      },
      NOW,
    );
    expect(views.map((v) => [v.id, v.status])).toEqual([
      ["w-live", "live"],
      ["w-drain", "draining"],
      ["w-gone", "gone"],
      ["w-gone2", "gone"],
    ]);
    expect(looked.sort()).toEqual(["j1", "j2"]);
    expect(views[0]?.inFlight).toBeUndefined();
    expect(views[2]).toMatchObject({ heartbeatAgeMs: 60_000, goneAfterMs: 3_000 });
    expect(views[2]?.inFlight?.map((j) => [j.jobId, j.fate])).toEqual([
      ["j1", "running_elsewhere"],
      ["j2", "finished"],
    ]);
    for (const v of views) expect(() => WorkerView.parse(v)).not.toThrow();
  });
});
