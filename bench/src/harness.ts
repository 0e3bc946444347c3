/**
 * What the prompt-agent harness adds to a step (docs/benchmarks.md#harness): a prompt agent's
 * loop run in this process against a provider that answers at once (Anthropic's streamed
 * Messages API), through the model gateway, with a host sandbox and its checkpoints in a real
 * nats-server's Object Store. Each step is a model call and one tool call; per step it measures
 * the step's whole time and takes away the model call (as the gateway timed it), the tool (as the
 * loop timed it) and the checkpoints (timed apart): what is left is what the harness adds.
 *
 *   pnpm bench:harness [loops] [steps]      # default 40 loops of 10 steps
 */
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { silentLogger } from "@boxcar/common";
import { openTopology, startNatsServer } from "@boxcar/fabric";
import { PromptAgent } from "@boxcar/protocol";
import { Checkpoints, createHostSandboxProvider, ModelGateway, runPromptLoop } from "@boxcar/worker";
import { connect } from "@nats-io/transport-node";
import { gitCommit, summarize, table } from "./stats.js";

const LOOPS = Number(process.argv[2] ?? 40);
const STEPS = Number(process.argv[3] ?? 10);

/** Answers at once: a tool call (read_file, or write_file every third step) until the last step, then text. */
let asked = 0;
const provider = createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    asked++;
    const step = ((asked - 1) % STEPS) + 1;
    const events: unknown[] = [
      {
        type: "message_start",
        message: {
          id: `m${asked}`,
          type: "message",
          role: "assistant",
          model: "bench",
          content: [],
          stop_reason: null,
          usage: { input_tokens: 10, output_tokens: 0 },
        },
      },
    ];
    if (step < STEPS) {
      const [tool, input] =
        step % 3 === 0 ? ["write_file", { path: `f${step}.txt`, content: "x".repeat(512) }] : ["read_file", { path: "notes.txt" }];
      events.push(
        { type: "content_block_start", index: 0, content_block: { type: "tool_use", id: `t${asked}`, name: tool, input: {} } },
        { type: "content_block_delta", index: 0, delta: { type: "input_json_delta", partial_json: JSON.stringify(input) } },
        { type: "content_block_stop", index: 0 },
        { type: "message_delta", delta: { stop_reason: "tool_use", stop_sequence: null }, usage: { output_tokens: 5 } },
      );
    } else {
      events.push(
        { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } },
        { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: "done" } },
        { type: "content_block_stop", index: 0 },
        { type: "message_delta", delta: { stop_reason: "end_turn", stop_sequence: null }, usage: { output_tokens: 1 } },
      );
    }
    events.push({ type: "message_stop" });
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.end(events.map((e) => `event: ${(e as { type: string }).type}\ndata: ${JSON.stringify(e)}\n\n`).join(""));
  });
});
await new Promise<void>((r) => provider.listen(0, "127.0.0.1", r));
const providerUrl = `http://127.0.0.1:${(provider.address() as AddressInfo).port}`;

const server = await startNatsServer();
const nc = await connect({ servers: server.url });
const topology = await openTopology(nc, { prefix: "benchharness" });
const gateway = await ModelGateway.start({ providers: { anthropic: { key: "sk-bench", baseUrl: providerUrl } } }, silentLogger);
const sandboxes = createHostSandboxProvider({ root: tmpdir() });
const agent = PromptAgent.parse({
  model: "anthropic/bench",
  template: "Read notes.txt.",
  tools: ["read_file", "write_file"],
  maxSteps: STEPS + 1,
});

const overhead: number[] = [];
const stateSave: number[] = [];
const workspaceSave: number[] = [];
const model: number[] = [];
for (let loop = 0; loop < LOOPS + 3; loop++) {
  const warmUp = loop < 3;
  const sandbox = await sandboxes.create({
    id: `sbx-${loop}`,
    jobId: `job${loop}`,
    attempt: 1,
    workerId: "bench",
    runtime: { sandbox: "host", network: "none", timeout: 600_000, limits: {} },
  });
  await sandbox.writeFile("notes.txt", new TextEncoder().encode("some notes\n".repeat(50)));
  const calls: number[] = [];
  const pass = gateway.open({ jobId: `job${loop}`, attempt: 1, providers: ["anthropic"], onCall: (c) => calls.push(c.latencyMs) });
  // Checkpoints timed apart; a step ends with its last checkpoint.
  const checkpoints = new Checkpoints(topology, `job${loop}`);
  const timed = { state: 0, workspace: 0 };
  const save = checkpoints.save.bind(checkpoints);
  const keep = checkpoints.saveWorkspace.bind(checkpoints);
  checkpoints.save = async (state) => {
    const t = performance.now();
    await save(state);
    timed.state += performance.now() - t;
    if (!warmUp) stateSave.push(performance.now() - t);
  };
  checkpoints.saveWorkspace = async (box) => {
    const t = performance.now();
    const kept = await keep(box);
    timed.workspace += performance.now() - t;
    if (!warmUp) workspaceSave.push(performance.now() - t);
    return kept;
  };
  let toolMs = 0;
  let stepStart = performance.now();
  let lastCalls = 0;
  const endStep = () => {
    // The previous step ended at its tool's last checkpoint: what it took, less what was not the harness's.
    const wall = performance.now() - stepStart;
    const modelMs = calls.slice(lastCalls).reduce((a, b) => a + b, 0);
    if (!warmUp && lastCalls > 0) {
      overhead.push(wall - modelMs - toolMs - timed.state - timed.workspace);
      model.push(modelMs);
    }
    lastCalls = calls.length;
    toolMs = 0;
    timed.state = 0;
    timed.workspace = 0;
    stepStart = performance.now();
  };
  const end = await runPromptLoop({
    agent,
    handoffs: [],
    signals: { count: () => 0, wait: () => new Promise(() => {}) },
    input: {},
    attempt: 1,
    sandbox,
    env: {},
    modelEnv: pass.env(),
    signal: new AbortController().signal,
    checkpoints,
    event: (type, step) => {
      if (type === "step" && step.n > 1) endStep();
      if (type === "tool_result") toolMs += step.tool?.durationMs ?? 0;
    },
    onText: () => {},
    progress: () => {},
    log: silentLogger,
  });
  if (end.text !== "done" || end.steps !== STEPS) throw new Error(`the loop did not end as scripted: ${JSON.stringify(end)}`);
  pass.close();
  await sandbox.destroy();
}

const row = (name: string, xs: number[]) => {
  const s = summarize(xs);
  return [name, s.p50.toFixed(2), s.p99.toFixed(2), String(xs.length)];
};
console.log(
  `Prompt-agent harness, commit ${gitCommit()}: ${LOOPS} loops of ${STEPS} steps (a model call and a tool call each), provider answering at once, host sandbox, node ${process.version}`,
);
console.log(
  table([
    ["per step", "p50 (ms)", "p99 (ms)", "samples"],
    row("harness added (step less model call, tool, checkpoints)", overhead),
    row("model call through the gateway (gateway's timing)", model),
    row("checkpoint: the loop's state", stateSave),
    row("checkpoint: the workspace (after write_file)", workspaceSave),
  ]),
);
await gateway.close();
await nc.close();
await server.stop();
provider.close();
