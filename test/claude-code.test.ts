import { fileURLToPath } from "node:url";
import { localSystem } from "@boxcar/testing";
import { expect, test } from "vitest";
import { startModelStandIn } from "./helpers/model-standin.js";

/**
 * The real Claude Code CLI (`@anthropic-ai/claude-code`, a root devDependency) as a host agent,
 * unchanged, pointed at its worker's model gateway only by the variables the worker gives it
 * (docs/models.md, "What the agent gets"), with the stand-in provider behind the gateway. It is
 * pinned to 2.1.112, the last release that is a Node.js program (later ones are a native binary
 * put in place by an install script, which pnpm does not run).
 */

const CLAUDE = fileURLToPath(new URL("../node_modules/.bin/claude", import.meta.url));
const KEY = "sk-ant-real-provider-key-0123456789";

test("Claude Code runs through the worker's gateway: a tool call and its answer, the provider gets the key and never the token, each call a model_call event", async () => {
  await using standIn = await startModelStandIn();
  await using system = await localSystem({
    worker: { modelGateway: { providers: { anthropic: { key: KEY, baseUrl: standIn.anthropicUrl } } } },
  });
  const { client } = system;
  await client.applyAgent({
    name: "claude-code",
    command: [CLAUDE, "-p", "what is this job's id?", "--output-format", "json", "--allowedTools", "Bash"],
    runtime: { sandbox: "host", timeout: "60s" },
    trusted: true,
    // No telemetry, updates or error reports. (2.1.112 still asks api.anthropic.com, as it exits,
    // whether metrics are enabled, whatever the flags: docs/models.md. Nothing answers here.)
    env: { CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: "1", DISABLE_TELEMETRY: "1", DISABLE_AUTOUPDATER: "1" },
    models: { providers: ["anthropic"] },
  });
  // The model first asks for a command, which Claude Code runs in the job's workspace, then answers.
  standIn.script({ kind: "answer", tool: "Bash", input: { command: "echo job $BOXCAR_JOB_ID", description: "print the job id" } });
  const { job } = await client.submit({ agent: "claude-code", input: {} });
  const done = await client.waitForJob(job.id);
  let stdout = "";
  let stderr = "";
  for await (const chunk of client.logs(job.id)) {
    if (chunk.stream === "stdout") stdout += Buffer.from(chunk.data).toString("utf8");
    else stderr += Buffer.from(chunk.data).toString("utf8");
  }
  expect(done.state, `${JSON.stringify(done.error)}\n${stderr}`).toBe("succeeded");
  const answer = JSON.parse(stdout) as { is_error: boolean; result: string; num_turns: number };
  expect(answer).toMatchObject({ is_error: false, result: "hello from the stand-in", num_turns: 2 });

  // Two calls reached the provider, Claude Code's own Messages requests, streamed, with the key.
  expect(standIn.requests).toHaveLength(2);
  for (const request of standIn.requests) {
    expect(request.path).toMatch(/^\/anthropic\/v1\/messages(\?|$)/);
    expect(request.body.stream).toBe(true);
    expect(request.headers["user-agent"]).toMatch(/^claude-cli\//);
    expect(request.headers["x-api-key"]).toBe(KEY);
    expect(request.headers.authorization).toBeUndefined();
    expect(JSON.stringify(request.headers)).not.toContain("bxm_");
  }
  // The second carries the command's output, run in the job's environment.
  const messages = standIn.requests[1]?.body.messages as { role: string; content: unknown }[];
  expect(JSON.stringify(messages.at(-1))).toContain(`job ${job.id}`);

  const events = [];
  for await (const e of client.events(job.id)) if (e.kind === "job") events.push(e);
  const calls = events.filter((e) => e.type === "model_call").map((e) => e.call);
  expect(calls.map((c) => [c?.provider, c?.endpoint, c?.status, c?.stream])).toEqual([
    ["anthropic", "/v1/messages", 200, true],
    ["anthropic", "/v1/messages", 200, true],
  ]);
  expect(calls.map((c) => c?.model)).toEqual(standIn.requests.map((r) => r.body.model));
  expect(done.usage).toMatchObject({ calls: 2 });
}, 90_000);
