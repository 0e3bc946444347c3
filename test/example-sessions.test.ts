/**
 * The tool-calling example (examples/sessions): its agent loop, with the scripted stand-in for a
 * model, runs its tools in a real Docker session as a submitter would, through the SDK and from
 * the command line.
 */
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { dockerReady } from "@boxcar/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { runAgent, runTool, type Turn } from "../examples/sessions/dist/agent-loop.js";
import { DEMO_TASK, scriptedModel } from "../examples/sessions/dist/scripted-model.js";
import { dockerSandboxes, type Principal, type SecuredSystem, securedSystem } from "./helpers/secured.js";

const ready = await dockerReady();
const MAIN = fileURLToPath(new URL("../examples/sessions/dist/main.js", import.meta.url));

describe.skipIf(!ready)("the tool-calling example (examples/sessions)", () => {
  let system: SecuredSystem;
  let alice: Principal;

  beforeAll(async () => {
    system = await securedSystem({ providers: dockerSandboxes });
    alice = await system.as("alice", "submitter");
    const admin = await system.as("admin", "admin");
    await admin.client.applyAgent({ name: "box", command: ["true"], sessions: true, runtime: { sandbox: "docker" } });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("the loop writes a script, runs it in the session, and answers with what the sandbox printed; the session is closed after", async () => {
    const seen: Turn[] = [];
    const run = await runAgent(alice.client, { agent: "box", task: DEMO_TASK, model: scriptedModel(), onTurn: (t) => seen.push(t) });
    expect(run.answer).toBe("It printed: 2 3 5 7 11 13 17 19 23 29");
    expect(seen.map((t) => t.role)).toEqual(["user", "assistant", "tools", "assistant", "tools", "assistant"]);
    expect(seen[4]).toMatchObject({ role: "tools", results: [{ isError: false, output: expect.stringMatching(/^exit 0\n2 3 5/) }] });
    expect((await alice.client.getSession(run.sessionId)).state).toBe("closed");
  });

  test("a tool that fails hands the model the error to read, not an exception", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const missing = await runTool(alice.client, session.id, { id: "1", name: "read_file", input: { path: "nope.txt" } });
    expect(missing).toMatchObject({ isError: true, output: expect.stringMatching(/^not_found/) });
    const escaping = await runTool(alice.client, session.id, { id: "2", name: "write_file", input: { path: "../x", content: "" } });
    expect(escaping).toMatchObject({ isError: true, output: expect.stringMatching(/^invalid/) });
    const failing = await runTool(alice.client, session.id, { id: "3", name: "bash", input: { command: "echo oops >&2; exit 3" } });
    expect(failing).toEqual({ id: "3", isError: true, output: "exit 3\n\nstderr:\noops\n" });
    const unknown = await runTool(alice.client, session.id, { id: "4", name: "rm_rf", input: {} } as never);
    expect(unknown).toEqual({ id: "4", isError: true, output: 'no tool "rm_rf": use bash, read_file or write_file' });
    await alice.client.closeSession(session.id);
  });

  test("from the command line, as a submitter, with the scripted model (no model API key)", async () => {
    const { ANTHROPIC_API_KEY: _, ...env } = process.env;
    const out = await new Promise<{ code: number; stdout: string; stderr: string }>((resolve) =>
      execFile(
        process.execPath,
        [MAIN, "--agent", "box", "--prefix", system.prefix],
        { env: { ...env, BOXCAR_NATS_URL: system.url, NATS_CREDS: alice.creds }, timeout: 60_000 },
        (err, stdout, stderr) => resolve({ code: err ? 1 : 0, stdout, stderr }),
      ),
    );
    expect(out.stderr).toBe("");
    expect(out.code).toBe(0);
    expect(out.stdout).toContain("-> write_file");
    expect(out.stdout).toContain("answer: It printed: 2 3 5 7 11 13 17 19 23 29");
  });
});
