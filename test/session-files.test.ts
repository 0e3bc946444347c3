/**
 * Big files streamed both ways, watches and input to background processes in Docker sessions
 * (docs/sessions.md#big-files, #watch, #background-processes), against a real nats-server with
 * authentication: a 50 MB file copied in and out in parts with matching SHA-256s, each copy
 * interrupted and resumed; a folder through the CLI both ways; the session's quota refusing a
 * copy before it starts; paths out of the workspace refused; an edit seen as a `file_changed`
 * event; a background `cat` fed through `sessions.input`; the owner rules on each.
 */

import { createHash, randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { BoxcarEvent } from "@boxcar/protocol";
import { dockerReady, eventually } from "@boxcar/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar, spawnBoxcar } from "./helpers/cli.js";
import { dockerSessions, type Principal, type SecuredSystem } from "./helpers/secured.js";

const ready = await dockerReady();
const MB = 1024 * 1024;
const sha256 = (data: Uint8Array) => createHash("sha256").update(data).digest("hex");
const text = (base64: string) => Buffer.from(base64, "base64").toString("utf8");

describe.skipIf(!ready)("big files, watches and input in a Docker session", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let viewer: Principal;
  let dir: string;

  beforeAll(async () => {
    ({ system, alice, bob, viewer } = await dockerSessions());
    dir = await mkdtemp(join(tmpdir(), "boxcar-session-files-"));
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test("a 50 MB file goes in and out with matching SHA-256s, each copy resumed after an interruption; the quota refuses a copy; paths out are refused", async () => {
    const big = randomBytes(50 * MB);
    const local = join(dir, "big.bin");
    await writeFile(local, big);
    const session = await alice.client.openSession({ agent: "box" });
    const { id } = session;

    // In: stopped after 10 MB, then again: it goes on from what the session holds.
    const stop = new AbortController();
    const onProgress = ({ done }: { done: number }) => done >= 10 * MB && stop.abort();
    await expect(alice.client.copyToSession(id, local, "data/big.bin", { signal: stop.signal, onProgress })).rejects.toThrow();
    const half = await alice.client.statSessionFile(id, "data/big.bin");
    expect(half.size).toBeGreaterThanOrEqual(10 * MB);
    expect(half.size).toBeLessThan(50 * MB);
    const [copiedIn] = await alice.client.copyToSession(id, local, "data/big.bin");
    expect(copiedIn).toMatchObject({ path: "data/big.bin", size: 50 * MB, sha256: sha256(big), resumedFrom: half.size });
    // The session's own sha256sum agrees.
    const summed = await alice.client.execInSession({ id, argv: ["sha256sum", "data/big.bin"] });
    expect(text(summed.stdout).split(" ")[0]).toBe(sha256(big));

    // Out: stopped after 20 MB (the part file holds it), then again from there.
    const out = join(dir, "back", "big.bin");
    const stopOut = new AbortController();
    await expect(
      alice.client.copyFromSession(id, "data/big.bin", out, {
        signal: stopOut.signal,
        onProgress: ({ done }) => done >= 20 * MB && stopOut.abort(),
      }),
    ).rejects.toThrow();
    const partial = (await stat(`${out}.boxcar-part`)).size;
    expect(partial).toBeGreaterThanOrEqual(20 * MB);
    await expect(stat(out)).rejects.toMatchObject({ code: "ENOENT" });
    const [copiedOut] = await alice.client.copyFromSession(id, "data/big.bin", out);
    expect(copiedOut).toMatchObject({ size: 50 * MB, sha256: sha256(big), resumedFrom: partial });
    expect(sha256(await readFile(out))).toBe(sha256(big));
    await expect(stat(`${out}.boxcar-part`)).rejects.toMatchObject({ code: "ENOENT" });

    // The quota: with 960 MiB more in the workspace (a sparse file, counted at its length), a
    // second 50 MB copy would pass 1 GiB: refused before a byte is written; the session goes on.
    expect((await alice.client.execInSession({ id, argv: ["truncate", "-s", "960M", "filler"] })).exitCode).toBe(0);
    await expect(alice.client.copyToSession(id, local, "data/again.bin")).rejects.toMatchObject({
      code: "quota_exceeded",
      message: expect.stringMatching(/past its quota of 1073741824/),
    });
    await expect(alice.client.statSessionFile(id, "data/again.bin")).rejects.toMatchObject({ code: "not_found" });
    await alice.client.removeSessionFile(id, "filler");
    expect((await alice.client.getSession(id)).state).toBe("open");

    // Paths out of the workspace, each way.
    for (const path of ["../escape.bin", "/etc/passwd", "data/../../x"]) {
      await expect(alice.client.copyToSession(id, local, path), path).rejects.toMatchObject({ code: "invalid" });
      await expect(alice.client.readSessionFilePart({ id, path, offset: 0, length: 10 }), path).rejects.toMatchObject({ code: "invalid" });
      await expect(alice.client.statSessionFile(id, path, { sha256: true }), path).rejects.toMatchObject({ code: "invalid" });
    }
    // A part where the file does not end, and a file that is not what its SHA-256 says.
    await expect(alice.client.writeSessionFile(id, "data/big.bin", "x", { offset: 5, size: 6 })).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining(`holds ${50 * MB} bytes`),
    });
    await expect(
      alice.client.writeSessionFile(id, "small.txt", "hello", { offset: 0, size: 5, sha256: "0".repeat(64) }),
    ).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining(sha256(Buffer.from("hello"))),
    });
    // Another submitter finds none of it; a viewer may not read it.
    await expect(bob.client.statSessionFile(id, "data/big.bin")).rejects.toMatchObject({ code: "not_found" });
    await expect(viewer.client.copyFromSession(id, "data/big.bin", join(dir, "viewer.bin"))).rejects.toMatchObject({ code: "forbidden" });
    await alice.client.closeSession(id);
  }, 240_000);

  test("a folder goes in and out through the CLI, its files and execute bits whole", async () => {
    const env = { NATS_CREDS: alice.creds };
    const cli = (...args: string[]) => boxcar(system.url, system.prefix, args, env);
    const tree = join(dir, "tree");
    await mkdir(join(tree, "a", "c"), { recursive: true });
    await writeFile(join(tree, "e.txt"), "top\n");
    await writeFile(join(tree, "a", "b.txt"), "nested\n");
    await writeFile(join(tree, "a", "c", "run.sh"), "#!/bin/sh\necho ran\n", { mode: 0o755 });
    const session = await alice.client.openSession({ agent: "box" });
    const copiedIn = await cli("session", "cp", tree, `${session.id}:proj`);
    expect(copiedIn.code, copiedIn.stderr).toBe(0);
    expect(copiedIn.stdout.trim().split("\n")).toHaveLength(3);
    const listed = await alice.client.listSessionFiles({ id: session.id, path: "proj" });
    expect(listed.files.map((f) => f.path)).toEqual(["proj/a/b.txt", "proj/a/c/run.sh", "proj/e.txt"]);
    const ran = await alice.client.execInSession({ id: session.id, argv: ["./proj/a/c/run.sh"] });
    expect(text(ran.stdout)).toBe("ran\n");

    const back = join(dir, "tree-back");
    const copiedOut = await cli("session", "cp", `${session.id}:proj`, back);
    expect(copiedOut.code, copiedOut.stderr).toBe(0);
    expect(await readFile(join(back, "a", "b.txt"), "utf8")).toBe("nested\n");
    expect(await readFile(join(back, "e.txt"), "utf8")).toBe("top\n");
    expect((await stat(join(back, "a", "c", "run.sh"))).mode & 0o111).not.toBe(0);
    // One side must be the session's.
    expect((await cli("session", "cp", tree, back)).code).toBe(2);
    await alice.client.closeSession(session.id);
  }, 90_000);

  test("a watch: an edit is a file_changed event, in order as they come; a path out of the workspace is refused; the CLI prints them", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const { id } = session;
    await alice.client.writeSessionFile(id, "src/a.txt", "one\n");
    for (const path of ["../etc", "/etc", "src/../../etc"]) {
      await expect(alice.client.watchSession({ id, path }), path).rejects.toMatchObject({ code: "invalid" });
    }
    await expect(alice.client.watchSession({ id, path: "nowhere" })).rejects.toMatchObject({ code: "not_found" });
    await expect(viewer.client.watchSession({ id })).rejects.toMatchObject({ code: "forbidden" });
    await expect(bob.client.watchSession({ id })).rejects.toMatchObject({ code: "not_found" });

    const watch = await alice.client.watchSession({ id, path: "src" });
    expect(watch).toMatchObject({ path: "src", active: true, folders: 1 });
    const changes: string[] = [];
    const follow = new AbortController();
    const following = (async () => {
      for await (const e of alice.client.sessionEvents(id, { follow: true, signal: follow.signal })) {
        if (e.kind === "session" && e.type === "file_changed" && e.watchId === watch.watchId) changes.push(`${e.change} ${e.path}`);
      }
    })();
    const seen = (change: string) => eventually(async () => (changes.includes(change) ? true : undefined), change);
    await alice.client.execInSession({ id, argv: ["sh", "-c", "echo two >> src/a.txt"] });
    await seen("modified src/a.txt");
    await alice.client.execInSession({ id, argv: ["sh", "-c", "mkdir -p src/new && echo x > src/new/b.txt && echo y > elsewhere.txt"] });
    await seen("created src/new/b.txt");
    await alice.client.removeSessionFile(id, "src/a.txt");
    await seen("removed src/a.txt");
    // In order, and nothing from outside the path watched.
    expect(changes[0]).toBe("modified src/a.txt");
    expect(changes).toContain("created src/new");
    expect(changes.at(-1)).toBe("removed src/a.txt");
    expect(changes.filter((c) => !c.includes(" src/"))).toEqual([]);
    // Unwatched: no more of its events.
    expect(await alice.client.unwatchSession(id, watch.watchId)).toMatchObject({ active: false });
    await alice.client.writeSessionFile(id, "src/later.txt", "z");
    await new Promise((r) => setTimeout(r, 500));
    expect(changes).not.toContain("created src/later.txt");
    follow.abort();
    await following;

    // The CLI: its changes as they come, until Ctrl-C; its watch ends with it.
    const watching = spawnBoxcar(system.url, system.prefix, ["session", "watch", id, "src"], { NATS_CREDS: alice.creds });
    await eventually(async () => (watching.output().includes("watching src") ? true : undefined), "the CLI's watch");
    await alice.client.writeSessionFile(id, "src/new/b.txt", "edited");
    await eventually(
      async () => (watching.output().includes("modified src/new/b.txt\n") ? true : undefined),
      "the CLI to print the change",
    );
    watching.kill("SIGINT");
    await new Promise((r) => watching.once("exit", r));
    const events: BoxcarEvent[] = [];
    for await (const e of alice.client.sessionEvents(id)) events.push(e);
    const cliWatch = events.filter((e) => e.kind === "session" && e.type === "file_changed").at(-1)?.watchId;
    expect(cliWatch).toBeDefined();
    await expect(alice.client.unwatchSession(id, cliWatch as string)).rejects.toMatchObject({ code: "not_found" });
    await alice.client.closeSession(id);
  }, 90_000);

  test("input: a background cat started with an open stdin gets what is sent, and its output shows it; a closed or ended process refuses", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const { id } = session;
    const cat = await alice.client.startInSession({ id, argv: ["cat"], openStdin: true, stdin: Buffer.from("first\n").toString("base64") });
    expect(cat).toMatchObject({ running: true, stdin: "open" });
    expect(await alice.client.inputInSession(id, cat.execId, "hello\n")).toMatchObject({ written: 6, process: { running: true } });
    // Its output comes live while its stdin stays open.
    const live = await eventually(async () => {
      let out = "";
      for await (const chunk of alice.client.sessionLogs(id)) out += Buffer.from(chunk.data).toString("utf8");
      return out.includes("hello\n") ? out : undefined;
    }, "cat's output");
    expect(live).toBe("first\nhello\n");
    await expect(viewer.client.inputInSession(id, cat.execId, "x")).rejects.toMatchObject({ code: "forbidden" });
    await expect(bob.client.inputInSession(id, cat.execId, "x")).rejects.toMatchObject({ code: "not_found" });
    await alice.client.inputInSession(id, cat.execId, "bye\n", { close: true });
    const ended = await alice.client.waitInSession({ id, execId: cat.execId, timeout: "10s" });
    expect(ended.result).toMatchObject({ exitCode: 0 });
    expect(text(ended.result?.stdout ?? "")).toBe("first\nhello\nbye\n");
    await expect(alice.client.inputInSession(id, cat.execId, "late\n")).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining("has ended"),
    });
    const closedStdin = await alice.client.startInSession({ id, argv: ["sleep", "30"] });
    await expect(alice.client.inputInSession(id, closedStdin.execId, "x")).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringContaining("openStdin"),
    });
    await expect(alice.client.inputInSession(id, `${id}.99`, "x")).rejects.toMatchObject({ code: "not_found" });

    // The CLI: its own stdin to the process, closed at its end.
    const env = { NATS_CREDS: alice.creds };
    const started = await boxcar(system.url, system.prefix, ["session", "start", id, "--open-stdin", "--", "cat"], env);
    expect(started.code, started.stderr).toBe(0);
    const execId = started.stdout.trim();
    const sent = await boxcar(system.url, system.prefix, ["session", "input", id, execId], env, undefined, "from the cli\n");
    expect(sent.code, sent.stderr).toBe(0);
    const waited = await boxcar(system.url, system.prefix, ["session", "wait", id, execId, "--timeout", "10s"], env);
    expect([waited.code, waited.stdout]).toEqual([0, "from the cli\n"]);
    await alice.client.closeSession(id);
  }, 90_000);
});
