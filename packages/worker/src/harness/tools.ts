import { BoxcarError, type BuiltinTool, ErrorCode } from "@boxcar/protocol";
import { z } from "zod";
import type { AttemptLease } from "../sandbox/lifeline.js";
import type { Sandbox } from "../sandbox/sandbox.js";

/**
 * The harness's built-in tools (docs/harness.md#tools). Each runs inside the job's sandbox,
 * through the same `Sandbox` the command agents run in: its paths are the workspace's (none may
 * leave it), its commands run with the agent's environment, limits and network. Each answer is
 * bounded (`MAX_TOOL_OUTPUT`) and each command in time; a failure is a tool error the model reads,
 * never the job's.
 */

/** The most of a tool's answer the model gets; past it, the head and the tail, saying how much was cut. */
export const MAX_TOOL_OUTPUT = 32 * 1024;
/** The largest file read_file reads and edit_file edits. */
const MAX_FILE_BYTES = 1024 * 1024;
/** The most entries list_files gives. */
const MAX_LISTED = 1_000;
const DEFAULT_COMMAND_S = 120;
const MAX_COMMAND_S = 600;

/** A relative path in the workspace, as the model gives it. */
const Path = z.string().min(1).max(4096);

const INPUTS = {
  bash: z.strictObject({
    command: z
      .string()
      .min(1)
      .max(64 * 1024),
    timeout: z.number().int().min(1).max(MAX_COMMAND_S).optional(),
  }),
  read_file: z.strictObject({ path: Path }),
  write_file: z.strictObject({ path: Path, content: z.string().max(MAX_FILE_BYTES) }),
  edit_file: z.strictObject({ path: Path, old: z.string().min(1), new: z.string() }),
  list_files: z.strictObject({ path: Path.optional() }),
  grep: z.strictObject({ pattern: z.string().min(1).max(4096), path: Path.optional() }),
} satisfies Record<BuiltinTool, z.ZodType>;

/** What the model is told of each tool: what it does and its arguments (a JSON Schema). */
export const TOOL_DESCRIPTIONS: Record<BuiltinTool, string> = {
  bash: `Runs a shell command (sh -c) in the workspace, the current folder, and gives its exit code and output (stdout and stderr together, at most ${MAX_TOOL_OUTPUT / 1024} KiB). It is stopped after \`timeout\` seconds (default ${DEFAULT_COMMAND_S}, at most ${MAX_COMMAND_S}).`,
  read_file: `Gives a file of the workspace (a path relative to it), at most ${MAX_TOOL_OUTPUT / 1024} KiB of it.`,
  write_file: "Writes a file of the workspace (a path relative to it), making its folders and replacing what was there.",
  edit_file: "Replaces the text `old`, which must occur exactly once in the file, with `new`.",
  list_files: `Lists the workspace's files (or those under \`path\`), with their sizes, at most ${MAX_LISTED}.`,
  grep: "Searches the workspace's files (or those under `path`) for an extended regular expression, giving each matching line as file:line:text.",
};

export function toolSchema(name: BuiltinTool): Record<string, unknown> {
  return z.toJSONSchema(INPUTS[name], { io: "input" }) as Record<string, unknown>;
}

/** What a tool gives the model: its text, and whether it failed. */
export interface ToolAnswer {
  output: string;
  error: boolean;
}

export interface ToolContext {
  sandbox: Pick<Sandbox, "exec" | "readFile" | "writeFile" | "listFiles">;
  /** The agent's environment, as a command agent gets it. */
  env: Record<string, string>;
  /** Aborted when the job ends (a cancel, a timeout): the command is killed. */
  signal: AbortSignal;
  /** The tool call's id (in `BOXCAR_TOOL_CALL_ID`, so that a command can be made idempotent). */
  callId: string;
  /** The attempt's hold on its job: a command is killed once it stops being renewed, as an agent's is. */
  attemptLease?: AttemptLease;
}

/** Runs one tool call; a call that cannot run (an unknown tool, bad arguments, a path outside) is a tool error. */
export async function runTool(name: string, input: unknown, ctx: ToolContext): Promise<ToolAnswer> {
  if (!Object.hasOwn(INPUTS, name)) {
    return { output: `there is no tool ${JSON.stringify(name)}: the tools are ${Object.keys(INPUTS).join(", ")}`, error: true };
  }
  const tool = name as BuiltinTool;
  const parsed = INPUTS[tool].safeParse(input);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join(".") || "(arguments)"}: ${i.message}`).join("; ");
    return { output: `bad arguments to ${tool}: ${issues}`, error: true };
  }
  try {
    return await TOOLS[tool](parsed.data as never, ctx);
  } catch (err) {
    if (ctx.signal.aborted) throw err;
    return { output: `${tool} failed: ${(err as Error).message}`, error: true };
  }
}

type Tools = { [T in BuiltinTool]: (input: z.infer<(typeof INPUTS)[T]>, ctx: ToolContext) => Promise<ToolAnswer> };

const TOOLS: Tools = {
  async bash({ command, timeout = DEFAULT_COMMAND_S }, ctx) {
    const { text, exitCode, timedOut } = await run(["sh", "-c", command], ctx, timeout);
    const status = timedOut ? `stopped after ${timeout} s` : `exit code ${exitCode ?? "none (killed by a signal)"}`;
    return { output: `${status}\n${text}`, error: timedOut || exitCode !== 0 };
  },

  async read_file({ path }, ctx) {
    const bytes = await readWhole(ctx, path);
    return { output: bound(new TextDecoder().decode(bytes)), error: false };
  },

  async write_file({ path, content }, ctx) {
    const bytes = new TextEncoder().encode(content);
    await ctx.sandbox.writeFile(path, bytes);
    return { output: `wrote ${bytes.length} bytes to ${path}`, error: false };
  },

  async edit_file({ path, old, new: replacement }, ctx) {
    const text = new TextDecoder().decode(await readWhole(ctx, path));
    const count = text.split(old).length - 1;
    if (count !== 1) {
      return {
        output: `${path}: the text to replace occurs ${count} times; it must occur exactly once (give more of its surroundings)`,
        error: true,
      };
    }
    const at = text.indexOf(old);
    await ctx.sandbox.writeFile(path, new TextEncoder().encode(text.slice(0, at) + replacement + text.slice(at + old.length)));
    return { output: `edited ${path}`, error: false };
  },

  async list_files({ path }, ctx) {
    const under = path?.replace(/\/+$/, "");
    const files = (await ctx.sandbox.listFiles(under ? [under] : undefined))
      .filter((f) => !under || f.path === under || f.path.startsWith(`${under}/`))
      .sort((a, b) => a.path.localeCompare(b.path));
    if (files.length === 0) return { output: under ? `no files under ${under}` : "the workspace has no files", error: false };
    const shown = files.slice(0, MAX_LISTED).map((f) => `${f.path} (${f.size} bytes)`);
    const more = files.length > MAX_LISTED ? `\n... and ${files.length - MAX_LISTED} more` : "";
    return { output: shown.join("\n") + more, error: false };
  },

  async grep({ pattern, path }, ctx) {
    const { text, exitCode } = await run(["grep", "-rnIE", "--", pattern, path ?? "."], ctx, DEFAULT_COMMAND_S);
    if (exitCode === 1) return { output: "no match", error: false };
    return { output: text, error: exitCode !== 0 };
  },
};

/** Runs a command in the sandbox with its output (both streams, in order) bounded. */
async function run(argv: string[], ctx: ToolContext, timeoutS: number) {
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), timeoutS * 1000);
  const onJobEnd = () => stop.abort();
  ctx.signal.addEventListener("abort", onJobEnd, { once: true });
  const output = new BoundedText();
  try {
    const exec = await ctx.sandbox.exec(argv, {
      env: { ...ctx.env, BOXCAR_TOOL_CALL_ID: ctx.callId },
      signal: stop.signal,
      ...(ctx.attemptLease ? { attemptLease: ctx.attemptLease } : {}),
      onOutput: (_stream, chunk) => output.push(chunk),
    });
    if (ctx.signal.aborted) throw new BoxcarError(ErrorCode.cancelled, "the job ended while the tool ran");
    return { text: output.text(), exitCode: exec.exitCode, timedOut: exec.aborted };
  } finally {
    clearTimeout(timer);
    ctx.signal.removeEventListener("abort", onJobEnd);
  }
}

async function readWhole(ctx: ToolContext, path: string): Promise<Uint8Array> {
  const body = await ctx.sandbox.readFile(path);
  if (!body) throw new Error(`${path}: no such file`);
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    if (size > MAX_FILE_BYTES) throw new Error(`${path} is larger than ${MAX_FILE_BYTES} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size);
}

/** Text cut to MAX_TOOL_OUTPUT: its head and its tail, and how much was left out between. */
export function bound(text: string): string {
  if (text.length <= MAX_TOOL_OUTPUT) return text;
  const half = MAX_TOOL_OUTPUT / 2;
  return `${text.slice(0, half)}\n[... ${text.length - MAX_TOOL_OUTPUT} characters cut ...]\n${text.slice(-half)}`;
}

/** A command's output as it comes: the first and the last MAX_TOOL_OUTPUT / 2 bytes kept, the middle counted. */
class BoundedText {
  private head: Buffer[] = [];
  private headBytes = 0;
  private tail = Buffer.alloc(0);
  private cut = 0;

  push(chunk: Uint8Array): void {
    const half = MAX_TOOL_OUTPUT / 2;
    let rest = Buffer.from(chunk);
    if (this.headBytes < half) {
      const take = rest.subarray(0, half - this.headBytes);
      this.head.push(take);
      this.headBytes += take.length;
      rest = rest.subarray(take.length);
    }
    if (rest.length === 0) return;
    const joined = Buffer.concat([this.tail, rest]);
    this.cut += Math.max(0, joined.length - half);
    this.tail = joined.subarray(Math.max(0, joined.length - half));
  }

  text(): string {
    const head = Buffer.concat(this.head).toString("utf8");
    const tail = this.tail.toString("utf8");
    return this.cut > 0 ? `${head}\n[... ${this.cut} bytes cut ...]\n${tail}` : head + tail;
  }
}
