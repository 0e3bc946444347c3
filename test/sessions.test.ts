/**
 * Sessions in host sandboxes (Docker ones: test/docker-sessions.test.ts) against a real nats-server with authentication, a real
 * dispatcher and a real worker: open, commands that keep their files between them, output live
 * and in the reply, one command at a time, owners only, the idle bound, close.
 */

import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BoxcarError, type SessionRecord } from "@boxcar/protocol";
import { eventually } from "@boxcar/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { type Principal, type SecuredSystem, securedSystem } from "./helpers/secured.js";

const text = (base64: string) => Buffer.from(base64, "base64").toString("utf8");

describe("sessions", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let viewer: Principal;
  let admin: Principal;

  beforeAll(async () => {
    system = await securedSystem();
    alice = await system.as("alice", "submitter");
    bob = await system.as("bob", "submitter");
    viewer = await system.as("viewer", "viewer");
    admin = await system.as("admin", "admin");
    await admin.client.applyAgent({
      name: "shell",
      command: ["true"],
      trusted: true,
      sessions: true,
      runtime: { sandbox: "host", timeout: "1m" },
    });
    await admin.client.applyAgent({ name: "closed", command: ["true"], trusted: true, runtime: { sandbox: "host", timeout: "1m" } });
    await admin.client.applyAgent({ name: "boxed", command: ["true"], sessions: true, runtime: { sandbox: "docker", timeout: "1m" } });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("commands in one session share its workspace; output comes in the reply and live on the session's log subject", async () => {
    const session = await admin.client.openSession({ agent: "shell" });
    expect(session).toMatchObject({ owner: "admin", agent: "shell", state: "open", execs: 0, sandbox: { kind: "host" } });
    const live: string[] = [];
    const sub = admin.nc.subscribe(admin.names.subjects.jobLogs("admin", session.id), {
      callback: (_err, msg) => {
        live.push(`${msg.headers?.get("Boxcar-Exec")}:${msg.string()}`);
      },
    });
    const write = await admin.client.execInSession({
      id: session.id,
      argv: ["sh", "-c", "echo kept > note.txt; echo wrote; echo warn >&2"],
    });
    expect(write).toMatchObject({ exitCode: 0, timedOut: false, truncated: false });
    expect(text(write.stdout)).toBe("wrote\n");
    expect(text(write.stderr)).toBe("warn\n");
    const read = await admin.client.execInSession({ id: session.id, argv: ["cat", "note.txt"], env: { GREETING: "hi" } });
    expect(text(read.stdout)).toBe("kept\n");
    const failed = await admin.client.execInSession({ id: session.id, argv: ["sh", "-c", "exit 7"] });
    expect(failed.exitCode).toBe(7);
    await eventually(async () => (live.some((l) => l === `${write.execId}:wrote\n`) ? true : undefined), "the output on the log subject");
    sub.unsubscribe();
    expect((await admin.client.getSession(session.id)).execs).toBe(3);
    const closed = await admin.client.closeSession(session.id);
    expect(closed).toMatchObject({ state: "closed", reason: "closed" });
    await expect(admin.client.execInSession({ id: session.id, argv: ["true"] })).rejects.toMatchObject({ code: "conflict" });
  });

  test("one command at a time: a second while one runs is refused, and a timeout ends the first", async () => {
    const session = await admin.client.openSession({ agent: "shell" });
    const slow = admin.client.execInSession({ id: session.id, argv: ["sleep", "30"], timeout: "1s" });
    await eventually(async () => ((await admin.client.getSession(session.id)).state === "open" ? true : undefined), "open");
    await new Promise((r) => setTimeout(r, 200));
    await expect(admin.client.execInSession({ id: session.id, argv: ["true"] })).rejects.toMatchObject({ code: "conflict" });
    const ended = await slow;
    expect(ended).toMatchObject({ timedOut: true, exitCode: null });
    expect((await admin.client.execInSession({ id: session.id, argv: ["true"] })).exitCode).toBe(0);
    await admin.client.closeSession(session.id);
  });

  test("only its owner uses a session: a submitter finds none, a viewer reads it but cannot run in it", async () => {
    const session = await admin.client.openSession({ agent: "shell" });
    await expect(bob.client.execInSession({ id: session.id, argv: ["cat", "/etc/hostname"] })).rejects.toMatchObject({ code: "not_found" });
    await expect(bob.client.closeSession(session.id)).rejects.toMatchObject({ code: "not_found" });
    expect(await bob.client.listSessions()).toEqual([]);
    expect((await viewer.client.getSession(session.id)).owner).toBe("admin");
    await expect(viewer.client.execInSession({ id: session.id, argv: ["true"] })).rejects.toMatchObject({ code: "forbidden" });
    // NATS itself refuses a submitter's request straight to the worker.
    await expect(
      bob.nc.request(bob.names.subjects.session(session.workerId, "exec"), JSON.stringify({ id: session.id, argv: ["id"] }), {
        timeout: 2_000,
      }),
    ).rejects.toThrow();
    expect((await admin.client.getSession(session.id)).execs).toBe(0);
    await admin.client.closeSession(session.id);
  });

  test("an idle session closes by itself, its workspace removed and its slot freed", async () => {
    const session: SessionRecord = await admin.client.openSession({ agent: "shell", idleTimeout: "1s" });
    const where = await admin.client.execInSession({ id: session.id, argv: ["pwd"] });
    const workspace = text(where.stdout).trim();
    expect(existsSync(workspace)).toBe(true);
    const closed = await eventually(async () => {
      const s = await admin.client.getSession(session.id);
      return s.state === "closed" ? s : undefined;
    }, "the idle session to close");
    expect(closed.reason).toBe("idle");
    expect(existsSync(workspace)).toBe(false);
    const events = await boxcar(system.url, system.prefix, ["sessions", "--json"], { NATS_CREDS: admin.creds });
    expect(JSON.parse(events.stdout).find((s: SessionRecord) => s.id === session.id)).toMatchObject({ state: "closed" });
  });

  test("who may open one: an agent must allow sessions, and only an admin runs commands of its own in a host sandbox", async () => {
    // A submitter would run anything as the worker's own user (its credential, other jobs' files): refused.
    await expect(alice.client.openSession({ agent: "shell" })).rejects.toSatisfy(
      (err: unknown) => err instanceof BoxcarError && err.code === "forbidden" && /only an admin/.test(err.message),
    );
    expect(await admin.client.listSessions({ state: "open" })).toEqual([]);
    // An agent an admin did not open to sessions: refused to everyone.
    await expect(admin.client.openSession({ agent: "closed" })).rejects.toSatisfy(
      (err: unknown) => err instanceof BoxcarError && err.code === "forbidden" && /does not allow sessions/.test(err.message),
    );
    await expect(admin.client.openSession({ agent: "nobody" })).rejects.toMatchObject({ code: "not_found" });
  });

  test("a session of an agent no live worker can run is refused, saying why", async () => {
    // The test worker has no Docker (test/docker-sessions.test.ts has one).
    await expect(admin.client.openSession({ agent: "boxed" })).rejects.toSatisfy(
      (err: unknown) => err instanceof BoxcarError && /no live worker in pool default can run/.test(err.message),
    );
  });

  test("the CLI opens a session, runs a command in it and closes it", async () => {
    const env = { NATS_CREDS: admin.creds };
    const opened = await boxcar(system.url, system.prefix, ["session", "open", "shell", "--json"], env);
    expect(opened.code, opened.stderr).toBe(0);
    const id = JSON.parse(opened.stdout).id as string;
    const ran = await boxcar(system.url, system.prefix, ["session", "exec", id, "--", "sh", "-c", "echo from-cli; exit 3"], env);
    expect(ran.stdout).toBe("from-cli\n");
    expect(ran.code).toBe(3);
    // Its history: the events, and the stored output.
    const events = await boxcar(system.url, system.prefix, ["session", "events", id], env);
    expect(events.stdout).toMatch(/session\s+opened/);
    expect(events.stdout).toMatch(/session\s+exec_exited\s+\S+\.1\s+exit 3/);
    const logs = await boxcar(system.url, system.prefix, ["session", "logs", id], env);
    expect(logs.stdout).toBe("from-cli\n");
    // Followed: what comes while it is open, until it closes.
    const following = spawnBoxcar(system.url, system.prefix, ["session", "events", id, "--follow"], env);
    await new Promise((r) => setTimeout(r, 1_500));
    expect(following.exitCode).toBeNull();
    await admin.client.execInSession({ id, argv: ["true"] });
    const closed = await boxcar(system.url, system.prefix, ["session", "close", id], env);
    expect(closed.code, closed.stderr).toBe(0);
    expect((await admin.client.getSession(id)).state).toBe("closed");
    expect((await exited(following)).code).toBe(0);
    expect(following.output()).toMatch(/exec_exited\s+\S+\.2\s+exit 0[\s\S]*session\s+closed/);
  });

  test("a host session: a file copied in and out in parts, a watch's events, input to a background process", async () => {
    const session = await admin.client.openSession({ agent: "shell" });
    const { id } = session;
    // In parts (each 512 KiB: 1.2 MiB in three), checked against its SHA-256, and out again.
    const data = Buffer.alloc(1_200_000, "boxcar ");
    const dir = await mkdtemp(join(tmpdir(), "boxcar-host-files-"));
    try {
      await writeFile(join(dir, "in.bin"), data);
      const [copied] = await admin.client.copyToSession(id, join(dir, "in.bin"), "data/in.bin");
      expect(copied?.sha256).toBe(createHash("sha256").update(data).digest("hex"));
      await admin.client.copyFromSession(id, "data/in.bin", join(dir, "out.bin"));
      expect((await readFile(join(dir, "out.bin"))).equals(data)).toBe(true);
      // Copied again: whole there already, nothing is sent. An empty file goes both ways too.
      const [again] = await admin.client.copyToSession(id, join(dir, "in.bin"), "data/in.bin");
      expect(again?.resumedFrom).toBe(data.length);
      await writeFile(join(dir, "empty"), "");
      await admin.client.copyToSession(id, join(dir, "empty"), "data/");
      expect(await admin.client.statSessionFile(id, "data/empty")).toEqual({ path: "data/empty", type: "file", size: 0 });
      const [back] = await admin.client.copyFromSession(id, "data/empty", `${dir}/`);
      expect(back?.local).toBe(join(dir, "empty"));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    await expect(admin.client.statSessionFile(id, "../outside")).rejects.toMatchObject({ code: "invalid" });
    // A watch: run by the helper alone, with the worker's Node.js, in the workspace.
    const watch = await admin.client.watchSession({ id, path: "data" });
    await admin.client.execInSession({ id, argv: ["sh", "-c", "echo more >> data/in.bin"] });
    const changed = await eventually(async () => {
      for await (const e of admin.client.sessionEvents(id)) {
        if (e.kind === "session" && e.type === "file_changed" && e.watchId === watch.watchId) return `${e.change} ${e.path}`;
      }
      return undefined;
    }, "the watch's event");
    expect(changed).toBe("modified data/in.bin");
    // Input: a named pipe the worker holds, read by the process.
    const cat = await admin.client.startInSession({ id, argv: ["cat"], openStdin: true, stdin: Buffer.from("one\n").toString("base64") });
    await admin.client.inputInSession(id, cat.execId, "two\n", { close: true });
    const ended = await admin.client.waitInSession({ id, execId: cat.execId, timeout: "10s" });
    expect(text(ended.result?.stdout ?? "")).toBe("one\ntwo\n");
    await admin.client.closeSession(id);
  });
});
