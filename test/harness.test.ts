import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { BoxcarClient } from "@boxcar/client";
import type { Topology } from "@boxcar/fabric";
import { type AgentDefinitionInput, type BoxcarEvent, harnessObjects } from "@boxcar/protocol";
import { dockerReady, eventually, localSystem, scratch } from "@boxcar/testing";
import { createDockerSandboxProvider, createHostSandboxProvider, createWorker } from "@boxcar/worker";
import Docker from "dockerode";
import { describe, expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { leasedSystem } from "./helpers/leased.js";
import { type ModelStandIn, type Scripted, startModelStandIn } from "./helpers/model-standin.js";

/**
 * Prompt agents (docs/harness.md): the worker runs the loop, calling the model through its
 * gateway (the stand-in provider behind it, speaking Anthropic's streamed Messages API), and runs
 * each tool call in the job's sandbox.
 */

const KEY = "sk-ant-real-provider-key-0123456789";
const dockerOk = await dockerReady();

/** A worker's model gateway, in front of the stand-in provider. */
const gatewayTo = (standIn: ModelStandIn) => ({ providers: { anthropic: { key: KEY, baseUrl: standIn.anthropicUrl } } });

/** A worker's options: Docker sandboxes for the system of `topology`, its models through the stand-in. */
const dockerWorker = (topology: Topology, standIn: ModelStandIn) => ({
  providers: [createDockerSandboxProvider({ prefix: topology.names.prefix, system: topology.systemId })],
  modelGateway: gatewayTo(standIn),
});

/** A local system whose worker (host sandboxes) calls its models through the stand-in. */
const modelSystem = (standIn: ModelStandIn) => localSystem({ worker: { modelGateway: gatewayTo(standIn) } });

/** A tool call of the model's, then (with no tool) its answer. */
const call = (id: string, tool: string, input: Record<string, unknown>): Scripted => ({ kind: "answer", tool, input, id });
const answer = (text: string): Scripted => ({ kind: "answer", text });

async function eventsOf(client: BoxcarClient, jobId: string): Promise<BoxcarEvent[]> {
  const events: BoxcarEvent[] = [];
  for await (const e of client.events(jobId)) events.push(e);
  return events;
}

/** The loop's events, one line each: `step 1 tool-calls`, `tool_call 1 write_file`, `tool_result 1 write_file ok`. */
function loopOf(events: BoxcarEvent[]): string[] {
  return events.flatMap((e) => {
    if (e.kind !== "job" || !e.step) return [];
    const { n, tool, finish } = e.step;
    if (e.type === "step") return [`step ${n} ${finish}`];
    if (e.type === "tool_call") return [`tool_call ${n} ${tool?.name}`];
    if (e.type === "tool_result") return [`tool_result ${n} ${tool?.name} ${tool?.error ? "error" : "ok"}`];
    return [];
  });
}

/** The text of the tool results the model was sent in a request (Anthropic's `tool_result` blocks). */
function toolResultsSent(standIn: ModelStandIn, request: number): string[] {
  const messages = (standIn.requests[request]?.body.messages ?? []) as { content: unknown }[];
  return messages.flatMap((m) =>
    Array.isArray(m.content)
      ? m.content.flatMap((b: { type?: string; content?: unknown }) => (b.type === "tool_result" ? [JSON.stringify(b.content)] : []))
      : [],
  );
}

describe.skipIf(!dockerOk)("a prompt agent in a Docker sandbox with no network", () => {
  test("writes a script and runs it with its tools, each run in the container; its answer is the job's result", async () => {
    await using standIn = await startModelStandIn();
    await using system = await localSystem({ worker: ({ topology }) => dockerWorker(topology, standIn) });
    const { client } = system;
    await client.applyAgent({
      name: "scripter",
      prompt: {
        model: "anthropic/claude-test",
        template: '{{role "system"}}\nYou write small programs.\n{{role "user"}}\nWrite {{file}} and run it.',
        tools: ["write_file", "bash"],
      },
      runtime: { sandbox: "docker" },
    } satisfies AgentDefinitionInput);
    standIn.script(
      call("t1", "write_file", { path: "run.sh", content: 'echo "computed $((6 * 7)) in $(hostname) as $BOXCAR_TOOL_CALL_ID"\n' }),
      call("t2", "bash", { command: "sh run.sh; wget -q -T 2 -O- http://1.1.1.1/ >/dev/null 2>&1 && echo online || echo offline" }),
      call("t3", "bash", { command: "sh run.sh; ls" }),
      answer("the script printed computed 42"),
    );
    const { job } = await client.submit({ agent: "scripter", input: { file: "run.sh" } });
    const done = await client.waitForJob(job.id);
    const events = await eventsOf(client, job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    expect(done.result?.output).toMatchObject({ text: "the script printed computed 42", steps: 4 });
    expect(done.sandbox?.kind).toBe("docker");
    expect(loopOf(events), events.map((e) => `${e.kind}.${e.type} ${e.kind === "job" ? (e.message ?? "") : ""}`).join("\n")).toEqual([
      "step 1 tool-calls",
      "tool_call 1 write_file",
      "tool_result 1 write_file ok",
      "step 2 tool-calls",
      "tool_call 2 bash",
      "tool_result 2 bash ok",
      "step 3 tool-calls",
      "tool_call 3 bash",
      "tool_result 3 bash ok",
      "step 4 stop",
    ]);
    // The prompt, filled with the input, went to the model; the command ran in the container
    // (its host name is the container's), with no network, and its output went back.
    expect(standIn.requests).toHaveLength(4);
    expect(standIn.requests[0]?.body.system).toEqual([expect.objectContaining({ text: "You write small programs." })]);
    expect(JSON.stringify(standIn.requests[0]?.body.messages)).toContain("Write run.sh and run it.");
    const ran = toolResultsSent(standIn, 2).join("\n");
    expect(ran).toContain("computed 42 in ");
    expect(ran).not.toContain(`computed 42 in ${(await import("node:os")).hostname()}`);
    expect(ran).toContain("as t2");
    expect(ran).toContain("offline");
    expect(standIn.requests.every((r) => r.headers["x-api-key"] === KEY)).toBe(true);
    // Many commands in one container: the third ran where the second did, the file still there.
    expect(toolResultsSent(standIn, 3).at(-1)).toContain("as t3");
    expect(toolResultsSent(standIn, 3).at(-1)).toContain("run.sh");
    expect(events.filter((e) => e.kind === "job" && e.type === "model_call")).toHaveLength(4);
  }, 120_000);
});

/**
 * A small MCP server (stdio, one JSON-RPC message a line), written here by hand as any server
 * speaks it: one tool that counts a workspace file's words and says where it ran.
 */
const WORD_COUNT_SERVER = `
const fs = require("node:fs");
const os = require("node:os");
const send = (m) => process.stdout.write(JSON.stringify(m) + "\\n");
let buffered = "";
process.stdin.on("data", (chunk) => {
  buffered += chunk;
  let end;
  while ((end = buffered.indexOf("\\n")) >= 0) {
    const line = buffered.slice(0, end);
    buffered = buffered.slice(end + 1);
    if (!line.trim()) continue;
    const req = JSON.parse(line);
    if (req.method === "initialize") {
      send({ jsonrpc: "2.0", id: req.id, result: { protocolVersion: req.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: "words", version: "1" } } });
    } else if (req.method === "tools/list") {
      send({ jsonrpc: "2.0", id: req.id, result: { tools: [{ name: "word_count", description: "Counts a file's words.", inputSchema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } }] } });
    } else if (req.method === "tools/call") {
      const text = fs.readFileSync(req.params.arguments.path, "utf8");
      send({ jsonrpc: "2.0", id: req.id, result: { content: [{ type: "text", text: text.split(/\\s+/).filter(Boolean).length + " words, counted on " + os.hostname() + " as uid " + process.getuid() + " with " + (process.env.WORDS_MODE || "no mode") }] } });
    } else if (req.id !== undefined) {
      send({ jsonrpc: "2.0", id: req.id, error: { code: -32601, message: "no method " + req.method } });
    }
  }
});
`;

describe.skipIf(!dockerOk)("a Docker prompt agent whose worker is killed", () => {
  test("resumes on another worker in a new container, its workspace laid out again, no completed model call sent twice", async () => {
    await using standIn = await startModelStandIn();
    await using s = await leasedSystem(1_500);
    await s.client.applyAgent({
      name: "boxed-counter",
      prompt: { model: "anthropic/claude-test", template: "Count.", tools: ["bash", "write_file"] },
      runtime: { sandbox: "docker" },
    });
    standIn.script(
      call("d1", "write_file", { path: "count.txt", content: "1\n" }),
      call("d2", "bash", { command: 'echo "2 in $(hostname)" >> count.txt; if [ "$BOXCAR_ATTEMPT" = 1 ]; then sleep 60; fi' }),
    );
    const env = { BOXCAR_TEST_ANTHROPIC: KEY };
    const flags = [
      "--sandboxes",
      "docker",
      "--model-key",
      "anthropic=BOXCAR_TEST_ANTHROPIC",
      "--model-url",
      `anthropic=${standIn.anthropicUrl}`,
    ];
    const doomed = spawnBoxcar(s.nats.url, s.prefix, ["worker", ...flags], env);
    const { job } = await s.client.submit({ agent: "boxed-counter", input: {} });
    await eventually(
      async () =>
        (await eventsOf(s.client, job.id)).some((e) => e.kind === "job" && e.type === "tool_call" && e.step?.n === 2) ? true : undefined,
      "step 2's tool call",
      60_000,
    );
    doomed.kill("SIGKILL");
    await exited(doomed);
    expect(standIn.requests).toHaveLength(2);
    standIn.script(call("d3", "bash", { command: "cat count.txt" }), answer("counted"));
    await using survivor = createWorker({
      ...s.nats.workerRole,
      ...dockerWorker(s.nats.topology, standIn),
    });
    void survivor.run();
    const done = await s.client.waitForJob(job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    expect(done).toMatchObject({ attempt: 2, sandbox: { kind: "docker" }, result: { output: { text: "counted", steps: 4 } } });
    expect(standIn.requests).toHaveLength(4); // 2 before the kill, none again, 2 after
    // The file as step 1 left it, and step 2's line once (its command ran again in the new container).
    const counted = toolResultsSent(standIn, 3).at(-1) ?? "";
    expect(counted).toMatch(/exit code 0\\n1\\n2 in [0-9a-f]+\\n"?$/);
    // The killed worker's container is gone (one attempt alive): none of the job's runs now.
    const left = await new Docker().listContainers({ filters: { label: [`boxcar.job=${job.id}`] } });
    expect(left).toEqual([]);
  }, 120_000);
});

describe.skipIf(!dockerOk)("an MCP server in a Docker sandbox", () => {
  test("is started inside the container and serves its tool to the model, with no network", async () => {
    await using standIn = await startModelStandIn();
    await using system = await localSystem({ worker: ({ topology }) => dockerWorker(topology, standIn) });
    const { client } = system;
    await client.applyAgent({
      name: "word-counter",
      prompt: {
        model: "anthropic/claude-test",
        template: "Count the words of notes.txt.",
        tools: ["write_file"],
        mcp: [{ name: "words", command: ["node", "-e", WORD_COUNT_SERVER], env: { WORDS_MODE: "strict" } }],
      },
      runtime: { sandbox: "docker" },
    });
    standIn.script(
      call("m1", "write_file", { path: "notes.txt", content: "one two three four" }),
      call("m2", "words__word_count", { path: "notes.txt" }),
      answer("four words"),
    );
    const { job } = await client.submit({ agent: "word-counter", input: {} });
    const done = await client.waitForJob(job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    // The model was offered the server's tool beside the built-in ones.
    const offered = ((standIn.requests[0]?.body.tools ?? []) as { name: string }[]).map((t) => t.name);
    expect(offered).toEqual(["write_file", "words__word_count"]);
    const counted = toolResultsSent(standIn, 2).at(-1) ?? "";
    expect(counted).toContain("4 words, counted on ");
    expect(counted).not.toContain(`counted on ${(await import("node:os")).hostname()} `);
    expect(counted).toContain("as uid 1000 with strict");
  }, 120_000);
});

describe.skipIf(!dockerOk)("tool calls in a Docker sandbox cannot reach the worker (the escape battery, as tool calls)", () => {
  test("no network, no NATS, no worker files, not root, no way out of the workspace by path", async () => {
    await using standIn = await startModelStandIn();
    await using system = await localSystem({ worker: ({ topology }) => dockerWorker(topology, standIn) });
    const { client } = system;
    await using canary = await scratch("canary-");
    await writeFile(join(canary.path, "secret.txt"), "worker-side secret");
    await client.applyAgent({
      name: "prober",
      prompt: { model: "anthropic/claude-test", template: "Probe.", tools: ["bash", "read_file", "write_file", "list_files"] },
      runtime: { sandbox: "docker" },
    });
    const battery = [
      `cat ${join(canary.path, "secret.txt")} 2>/dev/null || echo no-canary`,
      `ls ${process.cwd()} >/dev/null 2>&1 && echo worker-tree || echo no-worker-tree`,
      `(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/${system.nats.server.port}") 2>/dev/null && echo nats-reached || echo no-nats`,
      "(getent hosts deb.debian.org >/dev/null && echo dns) || echo no-dns",
      "for p in /etc/x /usr/x /x; do touch $p 2>/dev/null && echo wrote-$p || echo denied-$p; done",
      'echo "uid=$(id -u)"; grep -E "^CapEff:" /proc/self/status',
      "test -S /var/run/docker.sock && echo docker-socket || echo no-docker-socket",
      "env | grep -c sk-ant || true",
    ].join("; ");
    standIn.script(
      call("p1", "bash", { command: battery }),
      call("p2", "read_file", { path: "../../../../etc/hostname" }),
      call("p3", "write_file", { path: "../outside.txt", content: "x" }),
      call("p4", "read_file", { path: join(canary.path, "secret.txt") }),
      answer("probed"),
    );
    const { job } = await client.submit({ agent: "prober", input: {} });
    const done = await client.waitForJob(job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    const probed = toolResultsSent(standIn, 1).join("");
    for (const held of [
      "no-canary",
      "no-worker-tree",
      "no-nats",
      "no-dns",
      "denied-/etc/x",
      "denied-/usr/x",
      "denied-/x",
      "uid=1000",
      "no-docker-socket",
    ]) {
      expect(probed).toContain(held);
    }
    expect(probed).toMatch(/CapEff:\\t0000000000000000/);
    expect(probed).not.toContain("worker-side secret");
    expect(probed).toMatch(/\\n0\\n/); // no provider key in the environment
    const refused = toolResultsSent(standIn, 4).slice(1).join("\n");
    expect(refused).toContain("leaves the workspace");
    expect(refused).not.toContain("worker-side secret");
    expect(refused.match(/leaves the workspace/g)).toHaveLength(3);
  }, 120_000);
});

describe("a prompt agent's loop on the host", () => {
  const agent = (name: string, extra: Partial<NonNullable<AgentDefinitionInput["prompt"]>> = {}): AgentDefinitionInput => ({
    name,
    prompt: { model: "anthropic/claude-test", template: "Do the task: {{task}}", tools: ["bash", "read_file", "edit_file"], ...extra },
    runtime: { sandbox: "host" },
    trusted: true,
  });

  test("boxcar agent apply -f x.prompt: a prompt file from the docs runs, its steps in `boxcar events`; a bad template is refused at its line", async () => {
    await using standIn = await startModelStandIn();
    await using system = await modelSystem(standIn);
    const cli = (...args: string[]) => boxcar(system.nats.url, system.nats.topology.names.prefix, args);
    await using dir = await scratch("prompt-");
    const file = join(dir.path, "greeter.prompt");
    await writeFile(
      file,
      '---\nname: greeter\nmodel: anthropic/claude-test\ntools: [bash]\nsandbox: { sandbox: host }\ntrusted: true\nmaxSteps: 4\ninput:\n  schema:\n    name: string, who to greet\n---\n{{role "system"}}\nYou greet people.\n{{role "user"}}\nGreet {{name}}.\n',
    );
    const applied = await cli("agent", "apply", "-f", file);
    expect(applied.stdout, applied.stderr).toContain("agent greeter created");
    // Its input schema (Picoschema) is checked as a job is admitted: a wrong input never runs.
    const wrong = await cli("submit", "greeter", "--input", '{"nam":"Ada"}');
    expect(wrong.code, wrong.stderr).toBe(3);
    expect(wrong.stderr).toContain("input.name");
    expect(standIn.requests).toHaveLength(0);
    standIn.script(call("g1", "bash", { command: "echo hello $USER_NAME" }), answer("Hello, Ada!"));
    const run = await cli("submit", "greeter", "--input", '{"name":"Ada"}', "--wait", "--json");
    expect(run.code, run.stderr).toBe(0);
    const done = JSON.parse(run.stdout) as { id: string; state: string; result: { output: { text: string } } };
    expect(done).toMatchObject({ state: "succeeded", result: { output: { text: "Hello, Ada!" } } });
    const events = await cli("events", done.id);
    expect(events.stdout).toContain("step 1: tool-calls");
    expect(events.stdout).toContain('step 1: bash {"command":"echo hello $USER_NAME"}');
    expect(events.stdout).toContain("step 2: stop: Hello, Ada!");

    const bad = join(dir.path, "bad.prompt");
    await writeFile(bad, "---\nname: bad\nmodel: anthropic/claude-test\n---\nfine line\nbroken {{#if}\n");
    const refused = await cli("agent", "apply", "-f", bad);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain(`${bad}:6:1: template: the template does not parse (Handlebars)`);
  }, 60_000);

  test("a prompt agent hands off to another with its handoff tool; the next starts with its output files", async () => {
    await using standIn = await startModelStandIn();
    await using system = await modelSystem(standIn);
    const { client } = system;
    await client.applyAgent({
      ...agent("reviewer"),
      prompt: { model: "anthropic/claude-test", template: "Review {{what}}.", tools: ["read_file"] },
    });
    await client.applyAgent({
      ...agent("writer"),
      prompt: { model: "anthropic/claude-test", template: "Write notes, then hand them to the reviewer.", tools: ["write_file"] },
      handoffs: ["reviewer"],
    });
    standIn.script(
      call("w1", "write_file", { path: "out/notes.txt", content: "the notes" }),
      call("w2", "handoff", { to: "reviewer", input: { what: "out/notes.txt" }, summary: "wrote the notes" }),
      call("r1", "read_file", { path: "out/notes.txt" }),
      answer("the notes are fine"),
    );
    const { job } = await client.submit({ agent: "writer", input: {} });
    const first = await client.waitForJob(job.id);
    expect(first.state, JSON.stringify(first.error)).toBe("succeeded");
    expect(first.result).toMatchObject({ summary: "wrote the notes", handoff: { to: "reviewer", input: { what: "out/notes.txt" } } });
    // The handoff tool was offered with the agents it may name.
    const offered = (standIn.requests[0]?.body.tools ?? []) as {
      name: string;
      input_schema: { properties: { to?: { enum: string[] } } };
    }[];
    expect(offered.find((t) => t.name === "handoff")?.input_schema.properties.to?.enum).toEqual(["reviewer"]);
    const nextId = await eventually(async () => (await client.getJob(job.id)).handoff?.jobId, "the handoff's job");
    const next = await client.waitForJob(nextId);
    expect(next).toMatchObject({ agent: "reviewer", state: "succeeded", result: { output: { text: "the notes are fine" } } });
    expect(JSON.stringify(standIn.requests[2]?.body.messages)).toContain("Review out/notes.txt.");
    expect(toolResultsSent(standIn, 3).join("")).toContain("the notes");
  }, 60_000);

  test("a long conversation is compacted: older steps summarised through the model, the last ones kept whole, and the loop still ends", async () => {
    await using standIn = await startModelStandIn();
    await using system = await modelSystem(standIn);
    // The stand-in's prompts are 16 tokens: past compactAt 10 after every call.
    await system.client.applyAgent(agent("long-talker", { compactAt: 10, keepSteps: 2 }));
    standIn.script(
      call("c1", "bash", { command: "echo first-result" }),
      call("c2", "bash", { command: "echo second-result" }),
      call("c3", "bash", { command: "echo third-result" }),
      answer("so far: ran three commands, the first printed first-result"),
      answer("all done"),
    );
    const { job } = await system.client.submit({ agent: "long-talker", input: { task: "talk long" } });
    const done = await system.client.waitForJob(job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    expect(done.result?.output).toMatchObject({ text: "all done", steps: 4 });
    expect(standIn.requests).toHaveLength(5);
    // Before step 3 there were 2 steps, all kept; before step 4, 3: the first was summarised.
    expect(JSON.stringify(standIn.requests[3]?.body.messages)).toContain("Summarise the work so far");
    const last = JSON.stringify(standIn.requests[4]?.body.messages);
    expect(last).toContain("A summary of the earlier steps, which were compacted");
    expect(last).toContain("so far: ran three commands");
    expect(last).not.toContain("first-result\\n"); // step 1's tool result is gone
    expect(last).toContain("second-result");
    expect(last).toContain("third-result");
    const compacted = (await eventsOf(system.client, job.id)).filter((e) => e.kind === "job" && e.type === "compacted");
    expect(compacted).toHaveLength(1);
    expect(compacted[0]?.kind === "job" && compacted[0].message).toContain("keeping the last 2 steps whole");
  }, 60_000);

  test("a workflow's steps may be prompt agents: a step's output is the model's answer, which the next step's input names", async () => {
    await using standIn = await startModelStandIn();
    await using system = await modelSystem(standIn);
    const { client } = system;
    await client.applyAgent(agent("planner", { tools: [] }));
    await client.applyAgent(agent("doer", { tools: [] }));
    standIn.script(answer("plan: two steps"), answer("did the plan"));
    const { run } = await client.startRun({
      workflow: {
        name: "plan-then-do",
        steps: [
          { name: "plan", agent: "planner", input: { task: "{{ input.goal }}" } },
          { name: "do", agent: "doer", needs: ["plan"], input: { task: "{{ steps.plan.output.text }}" } },
        ],
        output: { done: "{{ steps.do.output.text }}" },
      },
      input: { goal: "tidy up" },
    });
    const finished = await client.waitForRun(run.id);
    expect(finished.state).toBe("succeeded");
    expect(finished.output).toEqual({ done: "did the plan" });
    expect(JSON.stringify(standIn.requests[0]?.body.messages)).toContain("Do the task: tidy up");
    expect(JSON.stringify(standIn.requests[1]?.body.messages)).toContain("Do the task: plan: two steps");
  }, 60_000);

  test("a tool that needs approval waits for a person: a denial is a tool error the model reads, an approval runs the call", async () => {
    await using standIn = await startModelStandIn();
    await using system = await modelSystem(standIn);
    const { client } = system;
    await client.applyAgent(agent("careful-deployer", { tools: ["bash"], approval: ["bash"] }));
    standIn.script(
      call("a1", "bash", { command: "echo first-ran" }),
      call("a2", "bash", { command: "echo second-ran" }),
      answer("deployed once"),
    );
    const { job } = await client.submit({ agent: "careful-deployer", input: { task: "deploy" } });
    const asked = async (n: number) =>
      eventually(
        async () =>
          (await eventsOf(client, job.id)).filter((e) => e.kind === "job" && e.type === "approval_requested").length >= n
            ? true
            : undefined,
        `approval request ${n}`,
      );
    await asked(1);
    expect((await client.getJob(job.id)).state).toBe("running");
    await client.signalJob(job.id, "deny", { call: "a1", reason: "not on a Friday" });
    await asked(2);
    await client.signalJob(job.id, "approve"); // no call named: the one waiting
    const done = await client.waitForJob(job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    const results = (await eventsOf(client, job.id)).flatMap((e) =>
      e.kind === "job" && e.type === "tool_result" ? [`${e.step?.tool?.error ? "error" : "ok"}: ${e.step?.tool?.output}`] : [],
    );
    expect(results[0]).toBe("error: a person denied this call: not on a Friday; it did not run");
    expect(results[1]).toMatch(/^ok: exit code 0\nsecond-ran/);
    expect(results.join("")).not.toContain("first-ran");
  }, 60_000);

  test("the system policy limits the tools prompt agents may use and whether they may start MCP servers", async () => {
    await using system = await localSystem();
    const { client } = system;
    await client.setPolicy({ agents: { tools: ["read_file", "grep"], mcp: false } });
    const bash = await client.applyAgent(agent("shell-user", { tools: ["read_file", "bash"] })).catch((e: unknown) => e);
    expect(bash).toMatchObject({
      code: "policy_denied",
      issues: [{ path: "definition.prompt.tools[1]", message: "bash is not allowed (allowed: read_file, grep)" }],
    });
    const mcp = await client
      .applyAgent(agent("mcp-user", { tools: ["read_file"], mcp: [{ name: "x", command: ["x"] }] }))
      .catch((e: unknown) => e);
    expect(mcp).toMatchObject({
      code: "policy_denied",
      issues: [{ path: "definition.prompt.mcp", message: "no agent may start MCP servers" }],
    });
    await expect(client.applyAgent(agent("reader", { tools: ["read_file"] }))).resolves.toMatchObject({ created: true });
  }, 60_000);

  test("bad tool calls are tool errors the model reads, never a failed job; a path outside the workspace is refused", async () => {
    await using standIn = await startModelStandIn();
    await using system = await modelSystem(standIn);
    await system.client.applyAgent(agent("careful"));
    standIn.script(
      call("a", "rm_everything", { path: "/" }),
      call("b", "bash", { cmd: "ls" }),
      call("c", "read_file", { path: "../../etc/passwd" }),
      call("d", "read_file", { path: "/etc/passwd" }),
      call("e", "edit_file", { path: "nothing.txt", old: "x", new: "y" }),
      answer("gave up politely"),
    );
    const { job } = await system.client.submit({ agent: "careful", input: { task: "look around" } });
    const done = await system.client.waitForJob(job.id);
    expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
    expect(done.result?.output).toMatchObject({ text: "gave up politely", steps: 6 });
    const results = (await eventsOf(system.client, job.id)).flatMap((e) =>
      e.kind === "job" && e.type === "tool_result" ? [`${e.step?.tool?.name}: ${e.step?.tool?.output}`] : [],
    );
    expect(results, JSON.stringify(results, null, 1)).toHaveLength(5);
    expect(results[0]).toContain("unavailable tool 'rm_everything'");
    expect(results[1]).toContain("bad arguments to bash");
    expect(results[2]).toMatch(/read_file failed: .*(outside|\.\.)/);
    expect(results[3]).toMatch(/read_file failed/);
    expect(results[3]).not.toContain("root:");
    expect(results[4]).toContain("nothing.txt: no such file");
    // Each error went back to the model as a tool result.
    expect(toolResultsSent(standIn, 5)).toHaveLength(5);
  }, 60_000);

  test("the guards: a doom loop is told, then stopped; maxSteps ends a loop that never answers", async () => {
    await using standIn = await startModelStandIn();
    await using system = await modelSystem(standIn);
    await system.client.applyAgent(agent("stuck", { doomLoop: 3 }));
    const same = { command: "echo again" };
    standIn.script(call("1", "bash", same), call("2", "bash", same), call("3", "bash", same), call("4", "bash", same));
    const { job } = await system.client.submit({ agent: "stuck", input: { task: "loop" } });
    const stuck = await system.client.waitForJob(job.id);
    expect(stuck.state).toBe("failed");
    expect(stuck.error).toMatchObject({ code: "doom_loop" });
    expect(stuck.error?.message).toContain("4 times in a row");
    // The third time, the model was told instead of the command running again.
    expect(toolResultsSent(standIn, 3).at(-1)).toContain("asked for bash with these same arguments 3 times in a row");

    await system.client.applyAgent(agent("busy", { maxSteps: 2 }));
    standIn.script(call("5", "bash", { command: "echo one" }), call("6", "bash", { command: "echo two" }));
    const { job: busy } = await system.client.submit({ agent: "busy", input: { task: "never stop" } });
    const ended = await system.client.waitForJob(busy.id);
    expect(ended.error).toMatchObject({ code: "max_steps" });
    expect(ended.attempt).toBe(1); // a guard is not retried

    // No progress: steps whose tool calls all fail (different calls each time): told, then stopped.
    await system.client.applyAgent(agent("lost", { stuckSteps: 2 }));
    const before = standIn.requests.length;
    standIn.script(
      call("n1", "read_file", { path: "a.txt" }),
      call("n2", "read_file", { path: "b.txt" }),
      call("n3", "read_file", { path: "c.txt" }),
      call("n4", "read_file", { path: "d.txt" }),
    );
    const { job: lost } = await system.client.submit({ agent: "lost", input: { task: "find it" } });
    const gaveUp = await system.client.waitForJob(lost.id);
    expect(gaveUp.error).toMatchObject({ code: "doom_loop" });
    expect(gaveUp.error?.message).toContain("the last 4 steps' tool calls all failed");
    expect(JSON.stringify(standIn.requests[before + 2]?.body.messages)).toContain("The tool calls of your last 2 steps all failed");
    expect(standIn.requests.length - before).toBe(4);
  }, 60_000);
});

test("a worker killed in the middle of the loop: another resumes from its checkpoint, sending no completed model call again", async () => {
  await using standIn = await startModelStandIn();
  await using s = await leasedSystem(1_500);
  await s.client.applyAgent({
    name: "six-steps",
    prompt: { model: "anthropic/claude-test", template: "Count to six.", tools: ["bash", "write_file"] },
    runtime: { sandbox: "host" },
    trusted: true,
  });
  standIn.script(
    call("s1", "write_file", { path: "count.txt", content: "1\n" }),
    call("s2", "bash", { command: "echo 2 >> count.txt" }),
    // Step 3's command is under way when its worker is killed; it runs once more on the next.
    call("s3", "bash", { command: 'echo 3 >> count.txt; if [ "$BOXCAR_ATTEMPT" = 1 ]; then sleep 30; fi' }),
  );
  const env = { BOXCAR_TEST_ANTHROPIC: KEY };
  const flags = [
    "--sandboxes",
    "host",
    "--host",
    "trusted",
    "--model-key",
    "anthropic=BOXCAR_TEST_ANTHROPIC",
    "--model-url",
    `anthropic=${standIn.anthropicUrl}`,
  ];
  const doomed = spawnBoxcar(s.nats.url, s.prefix, ["worker", ...flags], env);
  const { job } = await s.client.submit({ agent: "six-steps", input: {} });
  await eventually(
    async () =>
      (await eventsOf(s.client, job.id)).some((e) => e.kind === "job" && e.type === "tool_call" && e.step?.n === 3) ? true : undefined,
    "step 3's tool call",
    30_000,
  );
  doomed.kill("SIGKILL");
  await exited(doomed);
  expect(standIn.requests).toHaveLength(3);
  standIn.script(
    call("s4", "bash", { command: "echo 4 >> count.txt" }),
    call("s5", "bash", { command: "cat count.txt" }),
    answer("counted to four"),
  );
  // The one tool call under way (step 3's) runs again on the next worker, as it was asked (quickly: its attempt is 2).
  await using survivor = createWorker({
    ...s.nats.workerRole,
    providers: [createHostSandboxProvider()],
    modelGateway: gatewayTo(standIn),
  });
  void survivor.run();
  const done = await s.client.waitForJob(job.id);
  expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
  expect(done.attempt).toBe(2);
  expect(done.result?.output).toMatchObject({ text: "counted to four", steps: 6 });
  // Six model calls in all: the three before the kill were not sent again.
  expect(standIn.requests).toHaveLength(6);
  const events = await eventsOf(s.client, job.id);
  const calls = events.filter((e) => e.kind === "job" && e.type === "model_call");
  expect(calls.map((e) => e.attempt)).toEqual([1, 1, 1, 2, 2, 2]);
  // The workspace came back as it was after step 2 (the last tool call that ended), so step 3's
  // command, run again, appended its line once.
  const counted = toolResultsSent(standIn, 5).at(-1) ?? "";
  expect(counted).toContain("exit code 0\\n1\\n2\\n3\\n4\\n");
  expect(events.some((e) => e.kind === "job" && e.type === "progress" && e.message?.includes("resumed at step 3"))).toBe(true);
  const kept = async () =>
    Promise.all(Object.values(harnessObjects(job.id)).map(async (name) => (await s.nats.topology.artifacts.info(name))?.deleted === false));
  expect(await kept()).toEqual([true, true]);
  // Retention removes the checkpoint with the job.
  expect(await s.client.cleanJobs({ olderThan: 0, agent: "six-steps" })).toMatchObject({ deleted: 1 });
  expect(await kept()).toEqual([false, false]);
}, 120_000);
