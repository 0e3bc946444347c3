/**
 * Quotas on stored bytes (issue 44, item 6): a user's jobs' records and artifacts, and artifacts
 * in all, counted by the dispatcher from the job records it watches, and refused at admission with
 * their own code. Against a secured nats-server, a dispatcher and a host worker.
 */

import type { BoxcarError } from "@boxcar/protocol";
import { eventually } from "@boxcar/testing";
import { expect, test } from "vitest";
import { securedSystem } from "./helpers/secured.js";

const host = { trusted: true, runtime: { sandbox: "host" as const } };

test("a user past their quota of stored bytes, or a system past its quota of artifacts, is refused storage_quota_exceeded; deleting jobs makes room", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  const bob = await system.as("bob");
  // Each job keeps a 100 000-byte artifact and a record of about 1 KB.
  await admin.client.applyAgent({
    name: "maker",
    ...host,
    outputs: ["out/**"],
    command: ["sh", "-c", "mkdir -p out && head -c 100000 /dev/zero > out/a.bin"],
  });
  const quotas = { default: { bytes: "250Ki" } };
  await admin.client.setPolicy({ quotas });
  let ended = 0;
  /** Runs a job of `who`'s to its end, and waits for the dispatcher's watch (which counts the bytes) to have seen it end. */
  const run = async (who: typeof alice) => {
    const { job } = await who.client.submit({ agent: "maker" });
    expect((await who.client.waitForJob(job.id)).state).toBe("succeeded");
    ended += 1;
    await eventually(async () => ((await admin.client.countJobs()).counts.succeeded === ended ? true : undefined), "the count");
  };
  const refusal = (who: typeof alice) =>
    who.client.submit({ agent: "maker" }).then(
      ({ job }) => {
        throw new Error(`job ${job.id} was admitted`);
      },
      (err: BoxcarError) => err,
    );

  // Alice's third job takes her past 250 KiB (its artifact counts once it is stored): her fourth is refused.
  for (let i = 0; i < 3; i++) await run(alice);
  expect(await refusal(alice)).toMatchObject({
    code: "storage_quota_exceeded",
    message: expect.stringMatching(/^alice's jobs keep 29\d KiB of records and artifacts, and alice's quota is 250 KiB/),
  });
  // Bob's bytes are his own; an admin has no quota.
  await run(bob);
  await run(admin);

  // Artifacts in all: 500 000 bytes kept, past 450 KiB: new work is refused, the admin's too.
  await admin.client.setPolicy({ quotas: { ...quotas, artifacts: "450Ki" } });
  for (const who of [bob, admin]) {
    expect(await refusal(who)).toMatchObject({
      code: "storage_quota_exceeded",
      message: expect.stringContaining("the system keeps 488 KiB of artifacts, and the system policy allows 450 KiB (quotas.artifacts)"),
    });
  }

  // Deleting ended jobs gives the room back.
  expect(await admin.client.cleanJobs({ olderThan: 0 })).toMatchObject({ deleted: 5, kept: 0 });
  await eventually(
    () =>
      alice.client.submit({ agent: "maker" }).then(
        () => true,
        () => undefined,
      ),
    "alice's submit to be admitted",
  );
}, 60_000);
