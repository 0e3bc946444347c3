import { existsSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { eventually, natsFixture, scratch } from "@boxcar/testing";
import { createWorker, WorkspaceRoot, workspaceOwnerOf } from "@boxcar/worker";
import { expect, test } from "vitest";

test("a workspace folder's name says its system, worker and sandbox", async () => {
  await using root = await scratch("boxcar-names-");
  const ws = await new WorkspaceRoot(root.path, "2026-11-25T19:00:00.123Z").create({ workerId: "w-host-1a2b", sandboxId: "sbx-9f" });
  const name = ws.dir.slice(ws.dir.lastIndexOf("/") + 1);
  expect(name).not.toContain(":"); // taken as it is by engines (Docker's -v splits on it)
  expect(workspaceOwnerOf(name)).toEqual({ system: "2026-11-25T19_00_00.123Z", workerId: "w-host-1a2b", sandboxId: "sbx-9f" });
  expect(workspaceOwnerOf("boxcar-sbx-9f-abcdef")).toBeUndefined(); // named before owners were
});

test("a worker removes the workspaces its system's gone workers left, and no other", async () => {
  await using nats = await natsFixture();
  await using root = await scratch("boxcar-sweep-");
  const mine = new WorkspaceRoot(root.path, nats.topology.systemId);
  // A live worker of this system, with a workspace of its own here.
  await using live = createWorker({ ...nats.workerRole, workerId: "w-live", workRoot: root.path, pools: ["live"] });
  void live.run();
  await eventually(async () => (live.accepting ? true : undefined), "the live worker to start");
  const kept = [
    (await mine.create({ workerId: "w-live", sandboxId: "sbx-live" })).dir,
    (await new WorkspaceRoot(root.path, "another-system").create({ workerId: "w-gone", sandboxId: "sbx-other" })).dir,
    join(root.path, "not-a-workspace"),
  ];
  await mkdir(kept[2] as string);
  // A worker killed before it could clean up: no presence; its folder holds files and a locked folder.
  const left = await mine.create({ workerId: "w-gone", sandboxId: "sbx-left" });
  await left.writeFile("out/result.txt", new TextEncoder().encode("left behind"));

  await using sweeper = createWorker({
    ...nats.workerRole,
    workerId: "w-sweeper",
    workRoot: root.path,
    pools: ["sweep"],
    reapIntervalMs: 200,
  });
  void sweeper.run();
  await eventually(async () => (existsSync(left.dir) ? undefined : true), "the gone worker's workspace to be removed");
  for (const dir of kept) expect(existsSync(dir), dir).toBe(true);
});
