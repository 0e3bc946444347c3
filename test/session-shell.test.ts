/**
 * A shell on a terminal in a session (docs/sessions.md#shell), against a real nats-server with
 * authentication, in host and Docker sessions: `boxcar session shell` run inside `tmux` as a person
 * would use it (keys typed, the screen read, the window resized), and the SDK's `openShell` for
 * what a person cannot type: who may open one, and how it ends.
 */

import { readFileSync } from "node:fs";
import { dockerReady, eventually } from "@boxcar/testing";
import { createDockerSandboxProvider } from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { BOXCAR_BIN } from "./helpers/cli.js";
import { type Principal, type SecuredSystem, securedSystem } from "./helpers/secured.js";
import { tmuxReady, tmuxTerminal } from "./helpers/tmux.js";

const ready = await dockerReady();
const tmux = await tmuxReady();

/** Reads a shell's stream until `pattern` shows (as a person would wait for it). */
function untilShown(stream: NodeJS.ReadableStream, pattern: RegExp): Promise<string> {
  return new Promise((resolve, reject) => {
    let seen = "";
    const onData = (chunk: Buffer) => {
      seen += chunk.toString();
      if (pattern.test(seen)) {
        stream.off("data", onData);
        resolve(seen);
      }
    };
    stream.on("data", onData);
    stream.once("error", reject);
  });
}

/**
 * What a person does in `boxcar session shell`, in a tmux window of 100 by 30: a command and its
 * output, the terminal's size before and after the window is resized, Ctrl-C stopping a `sleep`,
 * and `exit 3` ending the CLI with code 3.
 */
async function usedAsAPerson(system: SecuredSystem, owner: Principal, session: string, user?: string): Promise<void> {
  await using term = await tmuxTerminal(
    [process.execPath, BOXCAR_BIN, "session", "--prefix", system.prefix, "shell", session],
    { BOXCAR_NATS_URL: system.url, NATS_CREDS: owner.creds, TERM: "screen" },
    { cols: 100, rows: 30 },
  );
  // A prompt, then a command whose output is not what was typed.
  await term.waitFor(/[$#] ?$/m, "a prompt");
  await term.type("echo hello-$((6 * 7))");
  await term.press("Enter");
  await term.waitFor(/^hello-42$/m, "the command's output");
  if (user !== undefined) {
    // As the session's commands run: the agent's user.
    await term.type("echo uid-$(id -u)");
    await term.press("Enter");
    await term.waitFor(new RegExp(`^uid-${user}$`, "m"), `the agent's user (${user})`);
  }
  // The terminal's size is the window's.
  await term.type("stty size");
  await term.press("Enter");
  await term.waitFor(/^30 100$/m, "the window's size (30 rows, 100 columns)");
  // Resized: the shell's terminal follows (SIGWINCH, a resize through the tunnel). The resize
  // comes on its own way: a person who sees the old size asks again.
  await term.resize(120, 40);
  let size = "";
  for (let tries = 0; tries < 20 && size !== "40 120"; tries++) {
    await term.type("clear; stty size");
    await term.press("Enter");
    const shown = await term.waitFor(/^\d+ \d+\n.*[$#] ?$/m, "a size and the prompt after it");
    size = /^(\d+ \d+)$/m.exec(shown)?.[1] ?? "";
  }
  expect(size).toBe("40 120");
  // Ctrl-C reaches what runs: the sleep ends by SIGINT (status 130), and the next command runs.
  await term.type("clear; echo started-$((2 + 3)); sleep 100");
  await term.press("Enter");
  await term.waitFor(/^started-5$/m, "the sleep started");
  await term.press("C-c");
  await term.type("echo status-$?");
  await term.press("Enter");
  await term.waitFor(/^status-130$/m, "the sleep's status: ended by SIGINT");
  // The shell's exit code is the CLI's.
  await term.type("exit 3");
  await term.press("Enter");
  await term.waitFor(/^\[exited 3\]$/m, "the CLI's exit code, 3");
  // It was a process of the session's, now ended with that code.
  const [shell] = (await owner.client.sessionProcesses(session)).filter((p) => p.terminal);
  expect(shell).toMatchObject({ running: false, exitCode: 3, terminal: true });

  // Another shell, and the session closes under it: the CLI says so and exits 255 (as ssh does).
  await using again = await tmuxTerminal(
    [process.execPath, BOXCAR_BIN, "session", "--prefix", system.prefix, "shell", session],
    { BOXCAR_NATS_URL: system.url, NATS_CREDS: owner.creds, TERM: "screen" },
    { cols: 100, rows: 30 },
  );
  await again.waitFor(/[$#] ?$/m, "a prompt");
  await again.type("echo pid-$$");
  await again.press("Enter");
  const pid = Number(/^pid-(\d+)$/m.exec(await again.waitFor(/^pid-\d+$/m, "the shell's pid"))?.[1]);
  await owner.client.closeSession(session);
  const ended = await again.waitFor(/^\[exited 255\]$/m, "the CLI's exit code, 255");
  expect(ended).toMatch(new RegExp(`the shell's connection ended: .*session ${session} closed`));
  // A host session's shell is a process of this machine: it is gone (a Docker session's went with its container).
  if (user === undefined) {
    await eventually(async () => (isRunning(pid) ? undefined : true), "the shell to end");
  }
}

/** Whether process `pid` of this machine still runs (a zombie does not). */
function isRunning(pid: number): boolean {
  try {
    return !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

/** Who may open one, bad input, and how it ends: through the SDK. */
async function refusalsAndEnds(owner: Principal, others: { stranger: Principal; viewer: Principal }, agent: string): Promise<void> {
  const session = await owner.client.openSession({ agent });
  const size = { cols: 80, rows: 24 };
  // Another user finds no such session; a viewer may not (a shell writes); an unknown session is not found.
  await expect(others.stranger.client.openShell(session.id, size)).rejects.toMatchObject({ code: "not_found" });
  await expect(others.viewer.client.openShell(session.id, size)).rejects.toMatchObject({ code: "forbidden" });
  await expect(owner.client.openShell("ses-nosuchsession0", size)).rejects.toMatchObject({ code: "not_found" });
  await expect(owner.client.openShell(session.id, { cols: 0, rows: 24 })).rejects.toMatchObject({ code: "invalid" });
  await expect(owner.client.openShell(session.id, { ...size, cwd: "../etc" })).rejects.toMatchObject({ code: "invalid" });

  // A command of its own on the terminal: its argv, its environment, a terminal's size; it ends by itself.
  const own = await owner.client.openShell(session.id, {
    ...size,
    argv: ["sh", "-c", 'stty size; echo "$GREETING"; test -t 0 && echo on-a-terminal; exit 7'],
    env: { GREETING: "hi there" },
  });
  expect(own.process).toMatchObject({ running: true, terminal: true });
  const shown = untilShown(own.stream, /on-a-terminal/);
  expect(await own.exited).toEqual({ exitCode: 7, signal: null });
  expect(await shown).toMatch(/24 80\r\nhi there\r\non-a-terminal/);

  // Resized through the SDK: what runs on it hears SIGWINCH and reads the new size.
  const resized = await owner.client.openShell(session.id, {
    ...size,
    argv: ["sh", "-c", 'trap "stty size; exit 5" WINCH; echo waiting; while :; do sleep 0.1; done'],
  });
  await untilShown(resized.stream, /waiting/);
  const after = untilShown(resized.stream, /\d+ \d+/);
  resized.resize(132, 43);
  expect(await after).toMatch(/43 132/);
  expect(await resized.exited).toEqual({ exitCode: 5, signal: null });

  // A shell counts among the session's processes: with 8 running, a shell is refused, saying so.
  const sleepers = [];
  for (let i = 0; i < 8; i++) sleepers.push(await owner.client.startInSession({ id: session.id, argv: ["sleep", "100"] }));
  await expect(owner.client.openShell(session.id, size)).rejects.toMatchObject({
    code: "conflict",
    message: expect.stringMatching(/8 processes in the background already/),
  });
  for (const sleeper of sleepers) {
    await owner.client.killInSession(session.id, sleeper.execId);
    await owner.client.waitInSession({ id: session.id, execId: sleeper.execId, timeout: "30s" });
  }

  // A shell is listed while it runs, and closing the session ends it, its caller told why.
  const shell = await owner.client.openShell(session.id, size);
  shell.stream.resume();
  expect((await owner.client.sessionProcesses(session.id)).find((p) => p.execId === shell.process.execId)).toMatchObject({
    running: true,
    terminal: true,
  });
  await owner.client.closeSession(session.id);
  await expect(shell.exited).rejects.toMatchObject({
    code: "tunnel_reset",
    message: expect.stringMatching(new RegExp(`session ${session.id} closed`)),
  });
}

describe.skipIf(!tmux)("a shell in a host session", () => {
  let system: SecuredSystem;
  let admin: Principal;
  let bob: Principal;
  let viewer: Principal;

  beforeAll(async () => {
    system = await securedSystem();
    admin = await system.as("admin", "admin");
    bob = await system.as("bob", "submitter");
    viewer = await system.as("viewer", "viewer");
    await admin.client.applyAgent({ name: "shell", command: ["true"], trusted: true, sessions: true, runtime: { sandbox: "host" } });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("boxcar session shell in tmux: a command, the window's size and its resize, Ctrl-C, exit 3 as the CLI's code; closing the session ends it", async () => {
    const session = await admin.client.openSession({ agent: "shell" });
    await usedAsAPerson(system, admin, session.id);
  }, 120_000);

  test("refusals (another user, a viewer, an unknown session, too many processes); a command of its own; closing the session ends it", async () => {
    await refusalsAndEnds(admin, { stranger: bob, viewer }, "shell");
  }, 120_000);
});

describe.skipIf(!tmux || !ready)("a shell in a Docker session", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let viewer: Principal;

  beforeAll(async () => {
    system = await securedSystem({ providers: ({ prefix, systemId }) => [createDockerSandboxProvider({ prefix, system: systemId })] });
    alice = await system.as("alice", "submitter");
    bob = await system.as("bob", "submitter");
    viewer = await system.as("viewer", "viewer");
    const admin = await system.as("admin", "admin");
    await admin.client.applyAgent({ name: "box", command: ["true"], sessions: true, runtime: { sandbox: "docker", timeout: "1m" } });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("boxcar session shell in tmux: a command, the window's size and its resize, Ctrl-C, exit 3 as the CLI's code; closing the session ends it", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await usedAsAPerson(system, alice, session.id, "1000");
  }, 120_000);

  test("refusals (another user, a viewer, an unknown session, too many processes); a command of its own; closing the session ends it", async () => {
    await refusalsAndEnds(alice, { stranger: bob, viewer }, "box");
  }, 120_000);
});
