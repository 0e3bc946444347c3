#!/usr/bin/env node
/**
 * Runs the agent loop from the command line, against the Boxcar system the environment names
 * (BOXCAR_NATS_URL or NATS_URL, NATS_CREDS, ... as the CLI takes them):
 *
 *   node examples/sessions/dist/main.js [--agent box] [--prefix boxcar] [TASK...]
 *
 * With ANTHROPIC_API_KEY set, a real model answers (BOXCAR_MODEL names it); without, a scripted
 * stand-in runs the demo task offline.
 */
import { parseArgs } from "node:util";
import { connectNats, createClient, resolveConnection } from "@boxcar/client";
import { names } from "@boxcar/protocol";
import { runAgent, type Turn } from "./agent-loop.js";
import { anthropicModel } from "./anthropic-model.js";
import { DEMO_TASK, scriptedModel } from "./scripted-model.js";

const { values, positionals } = parseArgs({
  options: { agent: { type: "string", default: "box" }, prefix: { type: "string" } },
  allowPositionals: true,
});
const apiKey = process.env.ANTHROPIC_API_KEY;
const model = apiKey ? anthropicModel({ apiKey, model: process.env.BOXCAR_MODEL ?? "claude-sonnet-4-5" }) : scriptedModel();
const task = positionals.length > 0 ? positionals.join(" ") : DEMO_TASK;

const connection = resolveConnection({ env: process.env });
const nc = await connectNats(connection, "boxcar-example-agent");
try {
  const client = createClient({ nc, names: names(values.prefix) }, { identity: connection.identity });
  const run = await runAgent(client, { agent: values.agent, task, model, onTurn: print });
  say(`\nanswer: ${run.answer}`);
} finally {
  await nc.close();
}

function print(turn: Turn): void {
  if (turn.role === "user") say(`task: ${turn.text}`);
  else if (turn.role === "assistant") {
    if (turn.text) say(`model: ${turn.text}`);
    for (const call of turn.calls) say(`  -> ${call.name} ${JSON.stringify(call.input).slice(0, 200)}`);
  } else for (const result of turn.results) say(`  <- ${result.output.split("\n")[0]}${result.isError ? " (error)" : ""}`);
}

/** A line to the terminal, without the control characters a model or a command could put in it (escape sequences). */
function say(line: string): void {
  // biome-ignore lint/suspicious/noControlCharactersInRegex: they are what is taken out
  process.stdout.write(`${line.replace(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/g, "")}\n`);
}
