/**
 * Background processes in sessions (docs/sessions.md#background-processes), in Docker sandboxes
 * against a real nats-server with authentication: started at once, several side by side, beside
 * the session's commands; listed, waited for and killed by the owner only; a viewer sees them;
 * a session with one running does not go idle; all are killed when the session closes.
 */

import { dockerReady, eventually } from "@boxcar/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";
import { dockerSessions, type Principal, type SecuredSystem } from "./helpers/secured.js";

const ready = await dockerReady();
const text = (base64: string) => Buffer.from(base64, "base64").toString("utf8");

describe.skipIf(!ready)("background processes in a Docker session", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let viewer: Principal;

  beforeAll(async () => {
    ({ system, alice, bob, viewer } = await dockerSessions());
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("a server started in the background answers the session's commands; processes run side by side, are listed, waited for and killed", async () => {
    const session = await alice.client.openSession({ agent: "box", idleTimeout: "3s" });
    const started = Date.now();
    const server = await alice.client.startInSession({
      id: session.id,
      argv: [
        "node",
        "-e",
        'require("node:http").createServer((q, s) => s.end("served " + q.url)).listen(8080, () => console.log("listening"))',
      ],
    });
    const sleeper = await alice.client.startInSession({ id: session.id, argv: ["sh", "-c", "echo napping; sleep 30"] });
    expect(Date.now() - started).toBeLessThan(5_000); // not after they end
    expect(server).toMatchObject({ running: true, argv: ["node", "-e", expect.any(String)] });
    // A command of the session reaches the server in the background (the container's own loopback).
    const fetched = await eventually(async () => {
      const got = await alice.client.execInSession({
        id: session.id,
        argv: ["node", "-e", 'fetch("http://127.0.0.1:8080/hello").then((r) => r.text()).then(console.log, () => process.exit(1))'],
      });
      return got.exitCode === 0 ? text(got.stdout) : undefined;
    }, "the background server to answer");
    expect(fetched).toBe("served /hello\n");
    expect((await alice.client.sessionProcesses(session.id)).map((p) => [p.execId, p.running])).toEqual([
      [server.execId, true],
      [sleeper.execId, true],
    ]);
    // A viewer sees them; another submitter may not touch them (nor see the session).
    expect(await viewer.client.sessionProcesses(session.id)).toHaveLength(2);
    await expect(bob.client.killInSession(session.id, server.execId)).rejects.toMatchObject({ code: "not_found" });
    await expect(viewer.client.killInSession(session.id, server.execId)).rejects.toMatchObject({ code: "forbidden" });
    // Waiting past its timeout says it still runs; killed, its result says so and keeps its output.
    const still = await alice.client.waitInSession({ id: session.id, execId: sleeper.execId, timeout: "200ms" });
    expect(still).toEqual({ process: expect.objectContaining({ running: true }) });
    // Idle for longer than its 3 s idle timeout, it stays open: a process runs in its background.
    await new Promise((r) => setTimeout(r, 4_000));
    expect((await alice.client.getSession(session.id)).state).toBe("open");
    await alice.client.killInSession(session.id, sleeper.execId);
    const ended = await alice.client.waitInSession({ id: session.id, execId: sleeper.execId, timeout: "10s" });
    expect(ended.process).toMatchObject({ running: false, killed: true });
    expect(ended.result).toMatchObject({ cancelled: true });
    expect(text(ended.result?.stdout ?? "")).toBe("napping\n");
    await expect(alice.client.waitInSession({ id: session.id, execId: `${session.id}.99` })).rejects.toMatchObject({ code: "not_found" });
    // Closing the session kills what still runs in its background.
    const closed = await alice.client.closeSession(session.id);
    expect(closed.state).toBe("closed");
    const events: string[] = [];
    for await (const e of alice.client.sessionEvents(session.id)) if (e.kind === "session") events.push(`${e.type}:${e.execId ?? ""}`);
    expect(events).toContain(`exec_exited:${server.execId}`);
  }, 90_000);

  test("a command that writes past the live window keeps its whole output, read part by part; a small one keeps none; closing removes it", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    // 6.9 MB on stdout (the live window is 4 MiB), a little on stderr.
    const big = await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "seq 1 1000000; echo done >&2"] });
    expect(big.exitCode).toBe(0);
    const expected = `${Array.from({ length: 1_000_000 }, (_, i) => i + 1).join("\n")}\n`;
    expect(big.kept).toEqual({ stdout: { bytes: expected.length }, stderr: { bytes: 5 } });
    const first = await alice.client.sessionOutput({ id: session.id, execId: big.execId, length: 1000 });
    expect(first).toMatchObject({ offset: 0, size: expected.length });
    expect(Buffer.from(first.data, "base64").toString("utf8")).toBe(expected.slice(0, 1000));
    const parts: Uint8Array[] = [];
    for await (const part of viewer.client.keptOutput(session.id, big.execId)) parts.push(part);
    expect(parts.length).toBeGreaterThan(1);
    expect(Buffer.concat(parts).toString("utf8") === expected).toBe(true);
    // From an offset (what a follower already printed).
    const rest: Uint8Array[] = [];
    for await (const part of alice.client.keptOutput(session.id, big.execId, "stdout", 4 * 1024 * 1024)) rest.push(part);
    expect(Buffer.concat(rest).toString("utf8")).toBe(expected.slice(4 * 1024 * 1024));
    // A small command's live output is whole: nothing is kept.
    const small = await alice.client.execInSession({ id: session.id, argv: ["echo", "hi"] });
    expect(small.kept).toBeUndefined();
    await expect(alice.client.sessionOutput({ id: session.id, execId: small.execId })).rejects.toMatchObject({ code: "not_found" });
    await expect(bob.client.sessionOutput({ id: session.id, execId: big.execId })).rejects.toMatchObject({ code: "not_found" });
    await alice.client.closeSession(session.id);
    await eventually(
      async () =>
        (await alice.client.sessionOutput({ id: session.id, execId: big.execId }).catch((e: { code?: string }) => e.code)) === "not_found"
          ? true
          : undefined,
      "the kept output to be removed",
    );
  }, 90_000);

  test("through the CLI: session exec prints exactly what a command wrote, past the live window too; start, ps, wait, kill and output", async () => {
    const env = { NATS_CREDS: alice.creds };
    const cli = (...args: string[]) => boxcar(system.url, system.prefix, args, env);
    const session = await alice.client.openSession({ agent: "box" });
    const started = await cli("session", "start", session.id, "--", "sh", "-c", "echo tick; sleep 30");
    expect(started.code, started.stderr).toBe(0);
    const execId = started.stdout.trim();
    // 6.9 MB on stdout while a process runs in the background: all of it, its own only, and no notice of a cut.
    const big = await cli("session", "exec", session.id, "--", "sh", "-c", "seq 1 1000000; echo warn >&2");
    expect(big.code, big.stderr).toBe(0);
    expect(big.stdout === `${Array.from({ length: 1_000_000 }, (_, i) => i + 1).join("\n")}\n`).toBe(true);
    expect(big.stderr).toBe("warn\n");
    const ps = await cli("session", "ps", session.id);
    expect(ps.stdout).toMatch(new RegExp(`${execId.replace(".", "\\.")}\\s+running`));
    const waiting = await cli("session", "wait", session.id, execId, "--timeout", "100ms");
    expect([waiting.code, waiting.stderr]).toEqual([1, `${execId} still runs\n`]);
    expect((await cli("session", "kill", session.id, execId)).stdout).toBe(`${execId} killed\n`);
    const ended = await cli("session", "wait", session.id, execId, "--timeout", "10s");
    expect(ended.stdout).toBe("tick\n");
    expect(ended.code).toBe(143); // killed (SIGTERM first, its group): 128 + 15, as docker exec says
    const execs = (await alice.client.getSession(session.id)).execs;
    const output = await cli("session", "output", session.id, `${session.id}.${execs}`);
    expect(output.stdout.length).toBe(6_888_896);
    await alice.client.closeSession(session.id);
  }, 90_000);
});
