/**
 * Sessions in E2B sandboxes: the real `e2b` SDK against the local stand-in (test/e2b-standin),
 * with a secured system (nats-server with authentication, a dispatcher, a worker): a submitter's
 * session, its commands (`cwd`, `stdin`, env, exit codes, cancel), its files through E2B's file
 * API, a snapshot resumed in a new E2B sandbox, a job run in the session, and the sandbox killed
 * when the session closes. The stand-in isolates nothing: these check what Boxcar asks of E2B,
 * not E2B's isolation.
 */

import { createHash } from "node:crypto";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { eventually } from "@boxcar/testing";
import { createE2BSandboxProvider } from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { type E2BStandIn, startE2BStandIn } from "./e2b-standin/index.js";
import { type Principal, type SecuredSystem, securedSystem } from "./helpers/secured.js";

const text = (base64: string) => Buffer.from(base64, "base64").toString("utf8");

describe("sessions in E2B sandboxes (the real e2b SDK against the local stand-in)", () => {
  let standin: E2BStandIn;
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;

  /** The stand-in's sandbox of a session (its metadata names the session). */
  const sandboxOf = (sessionId: string) => standin.sandboxes().find((s) => s.metadata.boxcarSession === sessionId);

  beforeAll(async () => {
    standin = await startE2BStandIn({ templates: { base: { cpuCount: 2, memoryMB: 512 } } });
    system = await securedSystem({
      // The worker's reaper looks every half second: it must leave a live session's sandbox alone.
      reapIntervalMs: 500,
      providers: ({ prefix, systemId }) => [
        createE2BSandboxProvider({
          apiKey: standin.apiKey,
          apiUrl: standin.apiUrl,
          sandboxUrl: standin.sandboxUrl,
          prefix,
          system: systemId,
        }),
      ],
    });
    alice = await system.as("alice", "submitter");
    bob = await system.as("bob", "submitter");
    const admin = await system.as("admin", "admin");
    await admin.client.applyAgent({
      name: "cloud",
      command: ["sh", "-c", 'cat notes.txt > out/seen.txt; printf \'{"output": "%s"}\' "$(wc -l < notes.txt)" > "$BOXCAR_RESULT_FILE"'],
      sessions: true,
      outputs: ["out/**"],
      env: { FROM_AGENT: "agent-env" },
      runtime: { sandbox: "e2b", template: "base", timeout: "1m" },
    });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
    await standin?.close();
  });

  test("a submitter's session: commands with cwd, stdin and env; files written, listed, read and removed through E2B's file API", async () => {
    const session = await alice.client.openSession({ agent: "cloud", maxLifetime: "2h" });
    expect(session).toMatchObject({ owner: "alice", state: "open", sandbox: { kind: "e2b" } });
    // The E2B sandbox lives as long as the session may (and the worker's margin of 5 minutes), not a job's timeout.
    expect(sandboxOf(session.id)?.timeouts.at(-1)).toBeGreaterThanOrEqual(7499);
    expect(sandboxOf(session.id)?.timeouts.at(-1)).toBeLessThanOrEqual(7500);
    await alice.client.writeSessionFile(session.id, "src/hello.txt", "from the API\n");
    const read = await alice.client.execInSession({
      id: session.id,
      argv: ["sh", "-c", "cat hello.txt; tr a-z A-Z; echo $FROM_AGENT"],
      cwd: "src",
      stdin: Buffer.from("piped\n").toString("base64"),
    });
    expect(read).toMatchObject({ exitCode: 0, cancelled: false, timedOut: false });
    expect(text(read.stdout)).toBe("from the API\nPIPED\nagent-env\n");
    // A missing cwd is refused before anything is written for the command (its environment file above all).
    await expect(alice.client.execInSession({ id: session.id, argv: ["true"], cwd: "nope" })).rejects.toMatchObject({
      code: "invalid",
      message: expect.stringContaining("cwd nope: no such folder"),
    });
    expect((await alice.client.listSessionFiles({ id: session.id })).files.map((f) => f.path)).toEqual(["src/hello.txt"]);
    const failed = await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "echo oops >&2; exit 3"] });
    expect(failed.exitCode).toBe(3);
    expect(text(failed.stderr)).toBe("oops\n");
    // A command's files reach the API, executable bits too.
    await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "mkdir -p out/deep && echo made > out/deep/x.txt"] });
    await alice.client.writeSessionFile(session.id, "bin/tool", "#!/bin/sh\necho tool ran\n", { executable: true });
    expect(text((await alice.client.execInSession({ id: session.id, argv: ["./bin/tool"] })).stdout)).toBe("tool ran\n");
    expect((await alice.client.listSessionFiles({ id: session.id })).files).toEqual([
      { path: "bin/tool", size: 24 },
      { path: "out/deep/x.txt", size: 5 },
      { path: "src/hello.txt", size: 13 },
    ]);
    expect((await alice.client.listSessionFiles({ id: session.id, path: "out" })).files.map((f) => f.path)).toEqual(["out/deep/x.txt"]);
    await expect(alice.client.listSessionFiles({ id: session.id, path: "nope" })).rejects.toMatchObject({ code: "not_found" });
    expect(Buffer.from(await alice.client.readSessionFile(session.id, "out/deep/x.txt")).toString()).toBe("made\n");
    expect(await alice.client.removeSessionFile(session.id, "out")).toBe(true);
    expect(await alice.client.removeSessionFile(session.id, "out")).toBe(false);
    await expect(alice.client.readSessionFile(session.id, "out/deep/x.txt")).rejects.toMatchObject({ code: "not_found" });
    await expect(alice.client.readSessionFile(session.id, "../etc/passwd")).rejects.toMatchObject({ code: "invalid" });
    await expect(alice.client.writeSessionFile(session.id, "/tmp/x", "no")).rejects.toMatchObject({ code: "invalid" });
    await expect(bob.client.execInSession({ id: session.id, argv: ["true"] })).rejects.toMatchObject({ code: "not_found" });
    // A port's tunnel is not built for E2B sessions: refused, saying so.
    await expect(alice.client.connectToSession(session.id, 8080)).rejects.toMatchObject({
      code: "invalid",
      message: expect.stringMatching(/not yet for e2b ones/),
    });
    // A shell on a terminal too.
    await expect(alice.client.openShell(session.id, { cols: 80, rows: 24 })).rejects.toMatchObject({
      code: "invalid",
      message: expect.stringMatching(/a shell on a terminal is built for Docker and host sessions, not yet for e2b ones/),
    });

    // Cancel ends a running command; the session goes on.
    const sleeping = alice.client.execInSession({ id: session.id, argv: ["sleep", "30"] });
    await new Promise((r) => setTimeout(r, 500));
    await alice.client.cancelInSession(session.id);
    expect(await sleeping).toMatchObject({ cancelled: true, exitCode: null });
    expect((await alice.client.execInSession({ id: session.id, argv: ["true"] })).exitCode).toBe(0);
    // Past a few reaps, the sandbox is still the session's.
    await new Promise((r) => setTimeout(r, 1_600));
    expect((await alice.client.execInSession({ id: session.id, argv: ["true"] })).exitCode).toBe(0);
    expect(sandboxOf(session.id)?.state).toBe("running");

    await alice.client.closeSession(session.id);
    expect(sandboxOf(session.id)?.state).toBe("killed");
  }, 60_000);

  test("a snapshot resumes in a new E2B sandbox with its files and execute bits; a job in the session sees its files", async () => {
    /** The archives Boxcar made beside the workspace (in the sandbox user's home) and left there. */
    const leftovers = (sessionId: string) =>
      readdirSync(join(sandboxOf(sessionId)?.root as string, "home/user")).filter((name) => name.startsWith(".boxcar-"));
    const session = await alice.client.openSession({ agent: "cloud" });
    const big = Buffer.alloc(700 * 1024, 3);
    await alice.client.execInSession({
      id: session.id,
      argv: [
        "sh",
        "-c",
        "mkdir -p keep/sub out && echo kept > keep/sub/a.txt && printf '#!/bin/sh\\necho runs\\n' > keep/run.sh && chmod +x keep/run.sh && head -c 716800 /dev/zero | tr '\\0' '\\3' > keep/big.bin && echo one > notes.txt",
      ],
    });
    const snapshot = await alice.client.snapshotSession(session.id);
    await eventually(async () => (leftovers(session.id).length === 0 ? true : undefined), "the snapshot's archive removed");
    await alice.client.closeSession(session.id);

    const resumed = await alice.client.openSession({ agent: "cloud", from: snapshot.id });
    expect(resumed.source).toEqual({ snapshot: snapshot.id });
    expect(sandboxOf(resumed.id)?.id).not.toBe(sandboxOf(session.id)?.id);
    expect(Buffer.from(await alice.client.readSessionFile(resumed.id, "keep/sub/a.txt")).toString()).toBe("kept\n");
    expect(text((await alice.client.execInSession({ id: resumed.id, argv: ["./keep/run.sh"] })).stdout)).toBe("runs\n");
    const digest = text((await alice.client.execInSession({ id: resumed.id, argv: ["sha256sum", "keep/big.bin"] })).stdout).split(" ")[0];
    expect(digest).toBe(createHash("sha256").update(big).digest("hex"));
    // The archive that carried the workspace in is gone too.
    expect(leftovers(resumed.id)).toEqual([]);

    // A job in the session: its agent reads the session's notes, its artifact comes back.
    await alice.client.execInSession({ id: resumed.id, argv: ["sh", "-c", "echo two >> notes.txt"] });
    const { job } = await alice.client.submit({ agent: "cloud", session: resumed.id });
    const done = await alice.client.waitForJob(job.id);
    expect(done).toMatchObject({ state: "succeeded", result: { output: "2" }, sandbox: { kind: "e2b", id: resumed.sandbox.id } });
    expect(done.artifacts.map((a) => a.path)).toEqual(["out/seen.txt"]);
    await alice.client.closeSession(resumed.id);
    await eventually(async () => (sandboxOf(resumed.id)?.state === "killed" ? true : undefined), "the resumed sandbox killed");
  }, 60_000);
});
