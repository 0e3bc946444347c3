/**
 * A tool-calling agent loop on a Boxcar session (docs/sessions.md): the model runs here, in this
 * process; the tools it calls (a shell, reading and writing files) run in a sandbox kept for the
 * whole conversation, so what one step writes the next one finds.
 */
import type { BoxcarClient } from "@boxcar/client";
import { BoxcarError } from "@boxcar/protocol";

/** A tool the model asks to run, with its input; `id` pairs it with its result. */
export type ToolCall =
  | { id: string; name: "bash"; input: { command: string } }
  | { id: string; name: "read_file"; input: { path: string } }
  | { id: string; name: "write_file"; input: { path: string; content: string } };

export interface ToolResult {
  id: string;
  output: string;
  isError: boolean;
}

/** The conversation as the loop keeps it. */
export type Turn =
  | { role: "user"; text: string }
  | { role: "assistant"; text: string; calls: ToolCall[] }
  | { role: "tools"; results: ToolResult[] };

/** A model: given the conversation so far, its next turn; no tool calls means it is done. */
export interface Model {
  next(turns: readonly Turn[]): Promise<{ text: string; calls: ToolCall[] }>;
}

/** The tools, described for a model's API (JSON Schema of each one's input). */
export const TOOLS = [
  {
    name: "bash",
    description: "Run a shell command in the workspace (a Linux sandbox kept between calls). Returns its exit code and output.",
    input_schema: { type: "object", properties: { command: { type: "string" } }, required: ["command"] },
  },
  {
    name: "read_file",
    description: "Read a text file of the workspace (a path relative to it).",
    input_schema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
  },
  {
    name: "write_file",
    description: "Write a text file in the workspace (a path relative to it), making its folders.",
    input_schema: {
      type: "object",
      properties: { path: { type: "string" }, content: { type: "string" } },
      required: ["path", "content"],
    },
  },
] as const;

/** The most of a tool's output handed back to the model. */
const MAX_TOOL_OUTPUT = 16 * 1024;

export interface AgentRun {
  /** The model's last text. */
  answer: string;
  turns: Turn[];
  /** The session the tools ran in (closed when the loop ends). */
  sessionId: string;
}

/**
 * Runs `task`: opens a session of `agent`, asks the model, runs the tools it calls in the
 * session, and hands back their results, until the model calls none (or `maxTurns`). The
 * session is closed at the end, whatever happens.
 */
export async function runAgent(
  client: BoxcarClient,
  opts: { agent: string; task: string; model: Model; maxTurns?: number; onTurn?: (turn: Turn) => void },
): Promise<AgentRun> {
  const session = await client.openSession({ agent: opts.agent, idleTimeout: "10m" });
  const turns: Turn[] = [];
  const add = (turn: Turn) => {
    turns.push(turn);
    opts.onTurn?.(turn);
  };
  try {
    add({ role: "user", text: opts.task });
    for (let i = 0; i < (opts.maxTurns ?? 20); i++) {
      const reply = await opts.model.next(turns);
      add({ role: "assistant", ...reply });
      if (reply.calls.length === 0) return { answer: reply.text, turns, sessionId: session.id };
      const results: ToolResult[] = [];
      for (const call of reply.calls) results.push(await runTool(client, session.id, call));
      add({ role: "tools", results });
    }
    throw new Error(`the model was still calling tools after ${opts.maxTurns ?? 20} turns`);
  } finally {
    await client.closeSession(session.id).catch(() => {});
  }
}

/** Runs one tool in the session; a refusal (a bad path, a missing file) is the model's to read, not an end. */
export async function runTool(client: BoxcarClient, sessionId: string, call: ToolCall): Promise<ToolResult> {
  try {
    switch (call.name) {
      case "bash": {
        const ran = await client.execInSession({ id: sessionId, argv: ["sh", "-c", call.input.command], timeout: "2m" });
        const stdout = Buffer.from(ran.stdout, "base64").toString("utf8");
        const stderr = Buffer.from(ran.stderr, "base64").toString("utf8");
        const status = ran.timedOut ? "timed out" : `exit ${ran.exitCode ?? ran.signal}`;
        return { id: call.id, output: bounded(`${status}\n${stdout}${stderr ? `\nstderr:\n${stderr}` : ""}`), isError: ran.exitCode !== 0 };
      }
      case "read_file":
        return {
          id: call.id,
          output: bounded(Buffer.from(await client.readSessionFile(sessionId, call.input.path)).toString("utf8")),
          isError: false,
        };
      case "write_file": {
        const wrote = await client.writeSessionFile(sessionId, call.input.path, call.input.content);
        return { id: call.id, output: `wrote ${wrote.size} bytes to ${wrote.path}`, isError: false };
      }
      default:
        // A model may name a tool there is none of: it reads that, as any other failure.
        return {
          id: (call as { id: string }).id,
          output: `no tool ${JSON.stringify((call as { name: unknown }).name)}: use bash, read_file or write_file`,
          isError: true,
        };
    }
  } catch (err) {
    if (err instanceof BoxcarError) return { id: call.id, output: `${err.code}: ${err.message}`, isError: true };
    throw err;
  }
}

function bounded(text: string): string {
  return text.length <= MAX_TOOL_OUTPUT
    ? text
    : `${text.slice(0, MAX_TOOL_OUTPUT)}\n[... ${text.length - MAX_TOOL_OUTPUT} more characters]`;
}
