/**
 * Jobs in a session (`submit --session`, docs/sessions.md#jobs-in-a-session) against a real
 * nats-server with authentication, a dispatcher, workers and a real Docker engine: a job sees the
 * session's files and leaves its own there, its result and artifacts come back as any job's (in
 * parts, past what one request carries), it holds the session's lock, the refusals, a handoff that
 * stays in the session, and the jobs of a worker killed with SIGKILL.
 */

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { BoxcarEvent, JobRecord } from "@boxcar/protocol";
import { dockerReady, eventually, scratch } from "@boxcar/testing";
import { jetstreamManager } from "@nats-io/jetstream";
import Docker from "dockerode";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar, exited } from "./helpers/cli.js";
import { sessionOnDoomedWorker } from "./helpers/doomed.js";
import { dockerSandboxes, type Principal, type SecuredSystem, securedSystem } from "./helpers/secured.js";

const ready = await dockerReady();
const text = (base64: string) => Buffer.from(base64, "base64").toString("utf8");
const SECRET = `session-job-token-${Date.now()}`;

/** A job's agent that reads the session's notes, adds a line, and leaves a large output file. */
const TURN = [
  "set -e",
  "mkdir -p out",
  "cp notes.txt out/seen.txt",
  'echo "turn $(cat "$BOXCAR_INPUT_FILE")" >> notes.txt',
  // 1.5 MiB of varied bytes: more than one request to the session's files carries.
  "head -c 1572864 /dev/urandom > out/big.bin",
  'printf \'{"output": {"lines": %s, "session": "%s", "big": "%s"}}\' "$(wc -l < notes.txt)" "$BOXCAR_SESSION" "$(sha256sum out/big.bin | cut -d" " -f1)" > "$BOXCAR_RESULT_FILE"',
].join("\n");

describe.skipIf(!ready)("jobs in a session (real engine)", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let admin: Principal;

  const finished = (p: Principal, id: string) => p.client.waitForJob(id);
  const sessionEvents = async (p: Principal, id: string) => {
    const events: BoxcarEvent[] = [];
    for await (const e of p.client.sessionEvents(id)) events.push(e);
    return events;
  };

  beforeAll(async () => {
    system = await securedSystem({
      providers: dockerSandboxes,
      reapIntervalMs: 500,
      sweepIntervalMs: 500,
      secretsEnv: { BOX_TOKEN: SECRET },
    });
    alice = await system.as("alice", "submitter");
    bob = await system.as("bob", "submitter");
    admin = await system.as("admin", "admin");
    const runtime = { sandbox: "docker", timeout: "1m", limits: { memory: "256Mi", pids: 64 } } as const;
    await admin.client.applyAgent({ name: "box", command: ["true"], sessions: true, runtime });
    await admin.client.applyAgent({ name: "turn", command: ["sh", "-c", TURN], sessions: true, outputs: ["out/**"], runtime });
    await admin.client.applyAgent({ name: "sleeper", command: ["sleep", "30"], sessions: true, runtime });
    await admin.client.applyAgent({ name: "closed-agent", command: ["true"], runtime });
    await admin.client.applyAgent({
      name: "hander",
      command: ["sh", "-c", 'echo \'{"handoff": {"to": "turn", "input": 9, "stayInSession": true}}\' > "$BOXCAR_RESULT_FILE"'],
      sessions: true,
      handoffs: ["turn"],
      runtime,
    });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("a job sees the session's files and leaves its own; its result and a 1.5 MiB artifact come back; the next job does not read its result", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await alice.client.writeSessionFile(session.id, "notes.txt", "opened\n");
    const { job } = await alice.client.submit({ agent: "turn", input: 1, session: session.id });
    expect(job.session).toEqual({ id: session.id, workerId: session.workerId });
    const done = await finished(alice, job.id);
    expect(done).toMatchObject({ state: "succeeded", workerId: session.workerId, sandbox: { kind: "docker", id: session.sandbox.id } });
    const output = done.result?.output as { lines: number; session: string; big: string };
    expect(output).toMatchObject({ lines: 2, session: session.id });
    // The artifacts, stored as any job's: what the job saw, and the large file whole.
    await using dir = await scratch("session-job-artifacts-");
    await alice.client.downloadArtifacts(job.id, dir.path);
    expect(readFileSync(join(dir.path, "out/seen.txt"), "utf8")).toBe("opened\n");
    const big = readFileSync(join(dir.path, "out/big.bin"));
    expect(big.length).toBe(1572864);
    expect(createHash("sha256").update(big).digest("hex")).toBe(output.big);
    // The session keeps what the job left, for its commands and the next job.
    expect(text((await alice.client.execInSession({ id: session.id, argv: ["cat", "notes.txt"] })).stdout)).toBe("opened\nturn 1\n");
    const second = await finished(alice, (await alice.client.submit({ agent: "turn", input: 2, session: session.id })).job.id);
    expect(second.result?.output).toMatchObject({ lines: 3 });
    // A job that writes no result gets none, not the one before it left in the workspace.
    const quiet = await finished(alice, (await alice.client.submit({ agent: "box", session: session.id })).job.id);
    expect(quiet).toMatchObject({ state: "succeeded" });
    expect(quiet.result?.output ?? null).toBeNull();
    await alice.client.closeSession(session.id);
    const types = (await sessionEvents(alice, session.id)).map((e) => `${e.type}${"jobId" in e && e.jobId ? `:${e.jobId}` : ""}`);
    expect(types).toEqual(
      expect.arrayContaining([`job_started:${job.id}`, `job_ended:${job.id}`, `job_started:${second.id}`, `job_ended:${second.id}`]),
    );
  }, 60_000);

  test("the lock: a job waits for a command to end, and a command is refused while a job runs", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const command = alice.client.execInSession({ id: session.id, argv: ["sleep", "2"] });
    await eventually(async () => ((await alice.client.getSession(session.id)).execs >= 0 ? true : undefined), "the session");
    await new Promise((r) => setTimeout(r, 300));
    const { job } = await alice.client.submit({ agent: "box", session: session.id });
    await new Promise((r) => setTimeout(r, 800));
    expect((await alice.client.getJob(job.id)).state).toBe("queued");
    const commandDone = await command;
    const endedAt = Date.now();
    expect(commandDone.exitCode).toBe(0);
    const done = await finished(alice, job.id);
    expect(done.state).toBe("succeeded");
    expect(Date.parse(done.startedAt as string)).toBeGreaterThanOrEqual(endedAt - 1_000);

    const { job: sleeping } = await alice.client.submit({ agent: "sleeper", session: session.id });
    await eventually(async () => ((await alice.client.getJob(sleeping.id)).state === "running" ? true : undefined), "the job to run");
    await expect(alice.client.execInSession({ id: session.id, argv: ["true"] })).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining(sleeping.id),
    });
    // The session's own cancel stops the job, as jobs.cancel would; the session lives on.
    await alice.client.cancelInSession(session.id);
    expect((await finished(alice, sleeping.id)).state).toBe("cancelled");
    expect((await alice.client.execInSession({ id: session.id, argv: ["true"] })).exitCode).toBe(0);
    const { job: again } = await alice.client.submit({ agent: "sleeper", session: session.id });
    await eventually(async () => ((await alice.client.getJob(again.id)).state === "running" ? true : undefined), "the job to run");
    await alice.client.cancelJob(again.id);
    expect((await finished(alice, again.id)).state).toBe("cancelled");
    await alice.client.closeSession(session.id);
  }, 60_000);

  test("jobs that wait for a session run one at a time, in the order they came; a workspace of 12 000 files outside the outputs is no matter", async () => {
    await admin.client.applyAgent({
      name: "appender",
      command: ["sh", "-c", 'mkdir -p out && cat "$BOXCAR_INPUT_FILE" >> out/order.txt && echo >> out/order.txt'],
      sessions: true,
      outputs: ["out/**"],
      runtime: { sandbox: "docker", timeout: "1m" },
    });
    const session = await alice.client.openSession({ agent: "box" });
    // More files than one listing carries, none of them under out/.
    await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "mkdir many && cd many && seq 1 12000 | xargs touch"] });
    const command = alice.client.execInSession({ id: session.id, argv: ["sleep", "2"] });
    await new Promise((r) => setTimeout(r, 300));
    const ids: string[] = [];
    for (const n of [1, 2, 3, 4, 5]) ids.push((await alice.client.submit({ agent: "appender", input: n, session: session.id })).job.id);
    await command;
    const done = await Promise.all(ids.map((id) => finished(alice, id)));
    expect(done.map((j) => j.state)).toEqual(["succeeded", "succeeded", "succeeded", "succeeded", "succeeded"]);
    expect(Buffer.from(await alice.client.readSessionFile(session.id, "out/order.txt")).toString()).toBe("1\n2\n3\n4\n5\n");
    // One at a time: each started after the one before it ended.
    for (let i = 1; i < done.length; i++) {
      expect(Date.parse(done[i]?.startedAt as string)).toBeGreaterThanOrEqual(Date.parse(done[i - 1]?.finishedAt as string));
    }
    await alice.client.closeSession(session.id);
  }, 60_000);

  test("refusals: another user's session, an agent that does not allow sessions, a closed session; a session that closes under a waiting job", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await expect(bob.client.submit({ agent: "box", session: session.id })).rejects.toMatchObject({ code: "not_found" });
    await expect(alice.client.submit({ agent: "closed-agent", session: session.id })).rejects.toMatchObject({
      code: "forbidden",
      message: expect.stringContaining("does not allow sessions"),
    });
    await expect(alice.client.submit({ agent: "box", session: "ses-nonesuch" })).rejects.toMatchObject({ code: "not_found" });
    // An agent this worker runs on the host may not run in a Docker session: the job fails, and is not handed round.
    await admin.client.applyAgent({ name: "hostly", command: ["true"], sessions: true, trusted: true, runtime: { sandbox: "host" } });
    const hostly = await finished(alice, (await alice.client.submit({ agent: "hostly", session: session.id })).job.id);
    expect(hostly).toMatchObject({ state: "failed", error: { code: "no_sandbox", message: expect.stringContaining("is a docker one") } });
    await expect(alice.client.submit({ agent: "box", session: "../x" })).rejects.toMatchObject({ code: "invalid" });

    // A job waits for a command; the session closes: the job ends session_lost.
    const command = alice.client.execInSession({ id: session.id, argv: ["sleep", "3"] }).catch((err: Error) => err);
    await new Promise((r) => setTimeout(r, 300));
    const { job } = await alice.client.submit({ agent: "box", session: session.id });
    await alice.client.closeSession(session.id);
    await command;
    expect(await finished(alice, job.id)).toMatchObject({ state: "failed", error: { code: "session_lost" } });
    await expect(alice.client.submit({ agent: "box", session: session.id })).rejects.toMatchObject({ code: "conflict" });

    // A handoff that asks to stay in a session from a job that ran in none is refused.
    await admin.client.applyAgent({
      name: "stray",
      command: ["sh", "-c", 'echo \'{"handoff": {"to": "box", "stayInSession": true}}\' > "$BOXCAR_RESULT_FILE"'],
      handoffs: ["box"],
      runtime: { sandbox: "docker" },
    });
    const { job: strayJob } = await alice.client.submit({ agent: "stray" });
    await alice.client.waitForChain(strayJob.id);
    const stray = await alice.client.getJob(strayJob.id);
    expect(stray.handoff).toMatchObject({ error: { code: "handoff_refused", message: expect.stringContaining("ran in no session") } });
  }, 60_000);

  test("a handoff that stays in the session runs there, and sees what the first job left", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await alice.client.writeSessionFile(session.id, "notes.txt", "opened\n");
    const { job: root } = await alice.client.submit({ agent: "hander", session: session.id });
    const next = await alice.client.waitForChain(root.id);
    expect((await alice.client.getJob(root.id)).handoff).toEqual({ to: "turn", jobId: next.id });
    expect(next).toMatchObject({ state: "succeeded", session: { id: session.id }, sandbox: { id: session.sandbox.id } });
    expect(next.result?.output).toMatchObject({ lines: 2, session: session.id });
    await alice.client.closeSession(session.id);
  }, 60_000);

  test("attack: a job in a submitter's session gets none of its agent's secrets (the owner reads what it writes); the same job outside one does", async () => {
    await admin.client.applyAgent({
      name: "secretive",
      command: [
        "sh",
        "-c",
        'token=$(printenv BOX_TOKEN || echo none); echo "$token" > leaked.txt; printf \'{"output": "%s"}\' "$token" > "$BOXCAR_RESULT_FILE"',
      ],
      secrets: ["BOX_TOKEN"],
      sessions: true,
      runtime: { sandbox: "docker" },
    });
    const session = await alice.client.openSession({ agent: "box" });
    const inSession = await finished(alice, (await alice.client.submit({ agent: "secretive", session: session.id })).job.id);
    expect(inSession).toMatchObject({ state: "succeeded", result: { output: "none" } });
    expect(Buffer.from(await alice.client.readSessionFile(session.id, "leaked.txt")).toString()).toBe("none\n");
    await alice.client.closeSession(session.id);
    // A job of its own gets the secret (redacted from what it reports): the check above can fail.
    const alone = await finished(alice, (await alice.client.submit({ agent: "secretive" })).job.id);
    expect(alone.state).toBe("succeeded");
    expect(alone.result?.output).not.toBe("none");
  }, 60_000);

  test("from the command line: submit --session, --wait", async () => {
    const env = { NATS_CREDS: alice.creds };
    const id = (await boxcar(system.url, system.prefix, ["session", "open", "box"], env)).stdout.trim();
    await alice.client.writeSessionFile(id, "notes.txt", "opened\n");
    const ran = await boxcar(system.url, system.prefix, ["submit", "turn", "--session", id, "--input", "7", "--wait", "--json"], env);
    expect(ran.code).toBe(0);
    const job = JSON.parse(ran.stdout) as JobRecord;
    expect(job).toMatchObject({ state: "succeeded", session: { id }, result: { output: { lines: 2 } } });
    const status = await boxcar(system.url, system.prefix, ["status", job.id], env);
    expect(status.stdout).toMatch(new RegExp(`session\\s+${id} \\(worker `));
    await alice.client.closeSession(id);
  }, 60_000);

  test("a worker whose sessions' consumer was removed (a dispatcher took it for gone) makes it again, and runs the next job", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const jsm = await jetstreamManager(admin.nc);
    // nats-server 2.10 may refuse a delete that races its own write of the consumer's state
    // ("unlinkat ...: directory not empty", seen in CI): as a dispatcher's sweep would, try again.
    await eventually(
      () =>
        jsm.consumers
          .delete(admin.names.streams.work, admin.names.workerConsumer(session.workerId))
          .catch((err: unknown) => (/not found/i.test(String(err)) ? true : undefined)),
      "the consumer to be removed",
    );
    const { job } = await alice.client.submit({ agent: "box", session: session.id });
    expect(await finished(alice, job.id)).toMatchObject({ state: "succeeded", workerId: session.workerId });
    await alice.client.closeSession(session.id);
  }, 60_000);

  test("items left on a gone worker's subject with no consumer are settled by the dispatchers' sweep", async () => {
    const jsm = await jetstreamManager(admin.nc);
    const js = jsm.jetstream();
    const subject = admin.names.subjects.sessionWork("ghost-worker");
    await js.publish(subject, "not a work item");
    const left = async () =>
      (await jsm.streams.info(admin.names.streams.work, { subjects_filter: subject })).state.subjects?.[subject] ?? 0;
    expect(await left()).toBe(1);
    await eventually(async () => ((await left()) === 0 ? true : undefined), "the ghost worker's item removed");
  }, 30_000);

  test("a worker killed with SIGKILL: its session's running and waiting jobs end session_lost, and its consumer goes", async () => {
    const { session, worker: doomed } = await sessionOnDoomedWorker(system, admin, alice);
    try {
      const { job: running } = await alice.client.submit({ agent: "sleeper", session: session.id });
      await eventually(async () => ((await alice.client.getJob(running.id)).state === "running" ? true : undefined), "the job to run");
      const { job: waiting } = await alice.client.submit({ agent: "box", session: session.id });
      doomed.kill("SIGKILL");
      await exited(doomed);
      for (const id of [running.id, waiting.id]) {
        const ended = await eventually(async () => {
          const job = await alice.client.getJob(id);
          return job.state === "queued" || job.state === "running" ? undefined : job;
        }, `job ${id} to end`);
        expect(ended).toMatchObject({
          state: "failed",
          error: { code: "session_lost", message: expect.stringContaining(session.workerId) },
        });
      }
      // Its session's container runs on (a killed worker closes nothing) until the system's worker reaps it.
      const engine = new Docker();
      await eventually(
        async () =>
          (await engine.listContainers({ all: true, filters: { label: [`boxcar.session=${session.id}`] } })).length === 0
            ? true
            : undefined,
        "the killed worker's session container reaped",
        30_000,
      );
      const jsm = await jetstreamManager(admin.nc);
      await eventually(async () => {
        const consumers: string[] = [];
        for await (const c of jsm.consumers.list(admin.names.streams.work)) consumers.push(c.name);
        return consumers.includes(admin.names.workerConsumer(session.workerId)) ? undefined : true;
      }, "the worker's consumer removed");
    } finally {
      doomed.kill("SIGKILL");
    }
  }, 90_000);
});
