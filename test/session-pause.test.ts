/**
 * Pausing a session (docs/sessions.md#pause), in Docker sandboxes against a real nats-server
 * with authentication: every process of its container held where it is and let go on from
 * there (the same process, its count going on), a background process's timeout not counting
 * the pause, requests that need it running refused meanwhile, its idle clock waiting, the
 * owner rules, closing a paused session, and host sessions refused, saying why.
 */

import { type ApiEndpoint, apiSchemaFile, jsonSchemas } from "@boxcar/protocol";
import { dockerReady, eventually } from "@boxcar/testing";
import { Ajv2020 } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import Docker from "dockerode";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";
import { dockerSessions, type Principal, type SecuredSystem } from "./helpers/secured.js";

const ready = await dockerReady();

/** Whether `session` is a valid reply of `endpoint` by its published JSON Schema (schemas/api/). */
function checkReply(endpoint: ApiEndpoint, session: unknown): void {
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats.default(ajv);
  const validate = ajv.compile({ ...(jsonSchemas()[apiSchemaFile(endpoint)] as object), $ref: "#/$defs/reply" });
  expect(validate({ session }) ? [] : validate.errors, `${endpoint} reply`).toEqual([]);
}

/** Each tick of the counter: the shell's process id, its count, the wall clock in seconds. */
const COUNTER = 'i=0; while :; do i=$((i+1)); echo "$$ $i $(date +%s)" >> ticks; sleep 0.2; done';

describe.skipIf(!ready)("pausing a Docker session", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let viewer: Principal;
  let admin: Principal;
  const engine = new Docker();
  const containerOf = async (sessionId: string) =>
    (await engine.listContainers({ all: true, filters: { label: [`boxcar.session=${sessionId}`] } }))[0];

  beforeAll(async () => {
    ({ system, alice, bob, viewer } = await dockerSessions());
    admin = await system.as("admin", "admin");
    await admin.client.applyAgent({
      name: "shell",
      command: ["true"],
      trusted: true,
      sessions: true,
      runtime: { sandbox: "host", timeout: "1m" },
    });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  const ticks = async (id: string) =>
    (await alice.client.readSessionFile(id, "ticks"))
      .toString()
      .trim()
      .split("\n")
      .map((line) => line.split(" ").map(Number) as [number, number, number]);

  test("a paused session's processes are held where they are and go on from there; what needs it running is refused meanwhile", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const id = session.id;
    const counter = await alice.client.startInSession({ id, argv: ["sh", "-c", COUNTER] });
    await eventually(async () => ((await ticks(id).catch(() => [])).length >= 3 ? true : undefined), "the counter to count");
    // Its timeout (6 s) is shorter than the pause below (7 s): it must not count the pause.
    const sleeper = await alice.client.startInSession({ id, argv: ["sleep", "60"], timeout: "6s" });

    // Another submitter finds no such session; a viewer may not pause it.
    await expect(bob.client.pauseSession(id)).rejects.toMatchObject({ code: "not_found" });
    await expect(viewer.client.pauseSession(id)).rejects.toMatchObject({ code: "forbidden" });
    await expect(alice.client.resumeSession(id)).rejects.toMatchObject({ code: "conflict", message: `session ${id} is not paused` });

    const paused = await alice.client.pauseSession(id, { timeout: "10m" });
    checkReply("sessions.pause", paused);
    expect(paused.pausedAt).toEqual(expect.any(String));
    expect(paused.pauseEndsAt).toEqual(expect.any(String));
    expect((await viewer.client.getSession(id)).pausedAt).toBe(paused.pausedAt);
    const { State } = await engine.getContainer((await containerOf(id))?.Id as string).inspect();
    expect(State.Paused).toBe(true);

    // Refused at once, saying so, rather than hanging: a command, a process, a file, a snapshot, a second pause.
    const refused = { code: "conflict", message: expect.stringContaining(`session ${id} is paused: resume it first`) };
    await expect(alice.client.execInSession({ id, argv: ["true"] })).rejects.toMatchObject(refused);
    await expect(alice.client.startInSession({ id, argv: ["true"] })).rejects.toMatchObject(refused);
    await expect(alice.client.readSessionFile(id, "ticks")).rejects.toMatchObject(refused);
    await expect(alice.client.snapshotSession(id)).rejects.toMatchObject(refused);
    await expect(alice.client.killInSession(id, sleeper.execId)).rejects.toMatchObject(refused);
    await expect(alice.client.pauseSession(id)).rejects.toMatchObject({ code: "conflict", message: `session ${id} is paused already` });
    // Listing its processes needs nothing of it: both still run. Nor may others resume it.
    expect((await viewer.client.sessionProcesses(id)).map((p) => [p.execId, p.running])).toEqual([
      [counter.execId, true],
      [sleeper.execId, true],
    ]);
    await expect(bob.client.resumeSession(id)).rejects.toMatchObject({ code: "not_found" });
    await expect(viewer.client.resumeSession(id)).rejects.toMatchObject({ code: "forbidden" });

    await new Promise((r) => setTimeout(r, 7_000));
    const resumed = await alice.client.resumeSession(id);
    checkReply("sessions.resume", resumed);
    expect(resumed.pausedAt).toBeUndefined();
    expect(resumed.state).toBe("open");
    // The sleeper's 6 s have not run out: the pause did not count.
    const after = await alice.client.sessionProcesses(id);
    expect(after.find((p) => p.execId === sleeper.execId)).toMatchObject({ running: true });

    // The counter goes on: the same shell, its count one after another with no restart, and a
    // hole of the pause's length in its clock (it ticks every 0.2 s when it runs).
    const before = (await ticks(id)).length;
    const lines = await eventually(async () => {
      const now = await ticks(id);
      return now.length > before + 3 ? now : undefined;
    }, "the counter to count on");
    expect(new Set(lines.map(([pid]) => pid)).size).toBe(1);
    expect(lines.map(([, n]) => n)).toEqual(lines.map((_, i) => i + 1));
    const gaps = lines.slice(1).map(([, , at], i) => at - (lines[i]?.[2] ?? at));
    expect(Math.max(...gaps)).toBeGreaterThanOrEqual(5);

    // Its timeout still ends the sleeper, once its 6 s of running time are up.
    const ended = await alice.client.waitInSession({ id, execId: sleeper.execId, timeout: "20s" });
    expect(ended.result).toMatchObject({ timedOut: true });
    expect((await alice.client.execInSession({ id, argv: ["true"] })).exitCode).toBe(0);

    const events: string[] = [];
    for await (const e of alice.client.sessionEvents(id)) if (e.kind === "session") events.push(e.type);
    expect(events.filter((t) => t === "paused" || t === "resumed")).toEqual(["paused", "resumed"]);
    await alice.client.closeSession(id);
  }, 120_000);

  test("a paused session outlives its idle timeout; closed while paused, its container goes", async () => {
    const session = await alice.client.openSession({ agent: "box", idleTimeout: "2s" });
    await alice.client.pauseSession(session.id);
    await new Promise((r) => setTimeout(r, 4_000));
    const still = await alice.client.getSession(session.id);
    expect(still).toMatchObject({ state: "open", pausedAt: expect.any(String) });
    const closed = await alice.client.closeSession(session.id);
    expect(closed).toMatchObject({ state: "closed", reason: "closed" });
    expect(await containerOf(session.id)).toBeUndefined();
  }, 60_000);

  test("resumed, its idle clock starts again; a pause that runs out closes it", async () => {
    const idle = await alice.client.openSession({ agent: "box", idleTimeout: "2s" });
    await alice.client.pauseSession(idle.id);
    await alice.client.resumeSession(idle.id);
    const closedIdle = await eventually(async () => {
      const s = await alice.client.getSession(idle.id);
      return s.state === "closed" ? s : undefined;
    }, "the resumed session to close idle");
    expect(closedIdle.reason).toBe("idle");

    const short = await alice.client.openSession({ agent: "box" });
    await alice.client.pauseSession(short.id, { timeout: "2s" });
    const closedPaused = await eventually(async () => {
      const s = await alice.client.getSession(short.id);
      return s.state === "closed" ? s : undefined;
    }, "the paused session to close at the pause's end");
    expect(closedPaused.reason).toBe("pause_timeout");
    await eventually(async () => ((await containerOf(short.id)) ? undefined : true), "its container removed");
  }, 60_000);

  test("the CLI pauses and resumes; a host session and bad input are refused, saying why", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const cli = (args: string[]) => boxcar(system.url, system.prefix, args, { NATS_CREDS: alice.creds });
    const paused = await cli(["session", "pause", session.id, "--timeout", "5m"]);
    expect(paused.stdout).toContain(`paused ${session.id}`);
    expect((await cli(["sessions"])).stdout).toContain("open (paused)");
    const refused = await cli(["session", "exec", session.id, "--", "true"]);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain("is paused: resume it first");
    expect((await cli(["session", "resume", session.id])).stdout).toContain(`resumed ${session.id}`);
    await alice.client.closeSession(session.id);

    await expect(alice.client.pauseSession(session.id)).rejects.toMatchObject({ code: "conflict" });
    await expect(alice.client.pauseSession(session.id, { timeout: "48h" })).rejects.toMatchObject({ code: "invalid" });
    const host = await admin.client.openSession({ agent: "shell" });
    await expect(admin.client.pauseSession(host.id)).rejects.toMatchObject({
      code: "invalid",
      message: expect.stringContaining("a host session cannot be paused"),
    });
    await admin.client.closeSession(host.id);
  }, 60_000);
});
