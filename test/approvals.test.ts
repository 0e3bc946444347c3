/**
 * Approvals in workflows (issue 21, part 4): a step `approval:` waits durably, with a timeout,
 * for an approve or reject from someone allowed to give it; against a real nats-server, a
 * dispatcher and a host worker, with a principal per user.
 */

import type { WorkflowDefinitionInput } from "@boxcar/protocol";
import { ErrorCode } from "@boxcar/protocol";
import { eventually } from "@boxcar/testing";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";
import { securedSystem } from "./helpers/secured.js";

/** Draft, then an approval by bob, then publish (which echoes who approved). */
const release = (timeout: string): WorkflowDefinitionInput => ({
  name: "release",
  steps: [
    { name: "draft", agent: "echo" },
    { name: "sign-off", needs: ["draft"], approval: { timeout, approvers: ["bob"], message: "ship it?" } },
    { name: "publish", agent: "echo", needs: ["sign-off"], input: { approvedBy: "{{ steps.sign-off.output.by }}" } },
  ],
});

test("an approval step waits, times out, and on another run is approved from the CLI by an allowed principal and refused to another", async () => {
  await using system = await securedSystem();
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  const bob = await system.as("bob");
  const carol = await system.as("carol");
  await admin.client.applyAgent({
    name: "echo",
    command: `printf '{"output":%s}' "$(cat "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"`,
    trusted: true,
    runtime: { sandbox: "host" },
  });

  // Nobody decides: it fails at its timeout, and so does the run; publish never starts.
  const late = (await alice.client.startRun({ workflow: release("1s") })).run;
  const timedOut = await admin.client.waitForRun(late.id);
  expect(timedOut.state).toBe("failed");
  expect(timedOut.steps["sign-off"]).toMatchObject({ state: "failed", reason: expect.stringContaining("nobody approved or rejected it") });
  expect(timedOut.steps.publish?.state).toBe("cancelled");

  // Another run: it waits (durably: its state is the run's record), visible in status.
  const { run } = await alice.client.startRun({ workflow: release("1h") });
  await eventually(
    async () => ((await alice.client.getRun(run.id)).steps["sign-off"]?.approval ? true : undefined),
    "the approval to be asked",
  );
  const status = await boxcar(system.url, system.prefix, ["workflow", "status", run.id], { NATS_CREDS: alice.creds });
  expect(status.stdout).toMatch(/sign-off\s+running\s+approval\s+waits for an approval by bob until/);

  // carol may neither see the run nor decide; alice sees it but is not its approver.
  await expect(carol.client.decideStep(run.id, "sign-off", "approve")).rejects.toMatchObject({ code: ErrorCode.notFound });
  await expect(alice.client.decideStep(run.id, "sign-off", "approve")).rejects.toMatchObject({
    code: ErrorCode.forbidden,
    message: expect.stringContaining("its approvers are bob"),
  });
  await expect(alice.client.decideStep(run.id, "draft", "approve")).rejects.toMatchObject({ code: ErrorCode.invalid });

  // bob finds it among the runs waiting for his decision (it is alice's); alice and carol do not.
  const awaitingBob = await boxcar(system.url, system.prefix, ["workflow", "ls", "--awaiting"], { NATS_CREDS: bob.creds });
  expect(awaitingBob.stdout).toContain(run.id);
  expect((await alice.client.listRunsPage({ awaiting: true, after: "" })).runs.map((r) => r.id)).not.toContain(run.id);
  expect((await carol.client.listRunsPage({ awaiting: true, after: "" })).runs).toEqual([]);
  expect((await admin.client.listRunsPage({ awaiting: true, after: "" })).runs.map((r) => r.id)).toContain(run.id);

  // bob approves from the command line; the run goes on and the next step sees who approved.
  const approved = await boxcar(system.url, system.prefix, ["workflow", "approve", run.id, "sign-off", "--comment", "lgtm"], {
    NATS_CREDS: bob.creds,
  });
  expect(approved.stdout).toContain(`${run.id}: step sign-off approved`);
  const done = await admin.client.waitForRun(run.id);
  expect(done.state).toBe("succeeded");
  expect(done.steps["sign-off"]?.approval).toMatchObject({ decision: "approved", by: "bob", comment: "lgtm" });
  expect(done.output).toEqual({ approvedBy: "bob" });
  await expect(bob.client.decideStep(run.id, "sign-off", "reject")).rejects.toMatchObject({ code: ErrorCode.conflict });
  expect((await bob.client.listRunsPage({ awaiting: true, after: "" })).runs.map((r) => r.id)).not.toContain(run.id);

  // A rejection fails the run, saying who and why.
  const rejected = (await alice.client.startRun({ workflow: release("1h") })).run;
  await eventually(async () => ((await alice.client.getRun(rejected.id)).steps["sign-off"]?.approval ? true : undefined), "the approval");
  await bob.client.decideStep(rejected.id, "sign-off", "reject", "not this week");
  const failed = await admin.client.waitForRun(rejected.id);
  expect(failed).toMatchObject({ state: "failed", error: { message: expect.stringContaining("rejected by bob: not this week") } });

  // An admin may decide any; a step with no approvers named is its run's owner's.
  const own = (
    await alice.client.startRun({
      workflow: { name: "own", steps: [{ name: "ok", approval: { timeout: "1h" } }] },
    })
  ).run;
  await eventually(async () => ((await alice.client.getRun(own.id)).steps.ok?.approval ? true : undefined), "the approval");
  await expect(bob.client.decideStep(own.id, "ok", "approve")).rejects.toMatchObject({ code: ErrorCode.notFound });
  await alice.client.decideStep(own.id, "ok", "approve");
  expect((await admin.client.waitForRun(own.id)).state).toBe("succeeded");

  // A step is an agent's or an approval, not both nor neither; an approval does not fan out.
  await expect(
    alice.client.startRun({ workflow: { name: "bad", steps: [{ name: "x", agent: "echo", approval: { timeout: "1h" } }] } }),
  ).rejects.toMatchObject({ code: ErrorCode.invalid });
  await expect(
    alice.client.startRun({ workflow: { name: "bad", steps: [{ name: "x", approval: { timeout: "1h" }, forEach: "{{ input }}" }] } }),
  ).rejects.toMatchObject({ code: ErrorCode.invalid });
});
