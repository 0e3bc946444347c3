import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";
import type { Logger } from "@boxcar/common";
import { BoxcarError, type BuiltinTool, ErrorCode, type HandoffRequest, type HarnessStep, type PromptAgent } from "@boxcar/protocol";
import { modelOf, STEP_EXCERPT } from "@boxcar/protocol/internal";
import { jsonSchema, type LanguageModel, type ModelMessage, streamText, type ToolCallPart, type ToolSet, tool } from "ai";
import type { AttemptLease } from "../sandbox/lifeline.js";
import type { Sandbox } from "../sandbox/sandbox.js";
import { type Checkpoints, type LoopState, restoreWorkspace } from "./checkpoint.js";
import { type McpServers, startMcpServers } from "./mcp.js";
import { renderPrompt } from "./render.js";
import { runTool, TOOL_DESCRIPTIONS, toolSchema } from "./tools.js";

/**
 * A prompt agent's loop (docs/harness.md), run by the worker for one attempt: the model is called
 * through the worker's gateway (its keys, limits, budgets and metering hold), one step at a time;
 * each tool call it asks for runs in the job's sandbox; each step is checkpointed before the next.
 * Its guards end it with their own codes: `max_steps`, `max_tokens`, `doom_loop`.
 */

/** The job events the loop publishes. */
export type LoopEventType = "step" | "tool_call" | "tool_result" | "compacted" | "approval_requested";

/** A signal sent to the job (`boxcar signal JOB NAME --payload JSON`), as the loop sees it. */
export interface JobSignal {
  name: string;
  payload: unknown;
}

/** The job's signals: how many came so far, and a wait for the first (come or to come) that `match` takes, by its place. */
export interface JobSignals {
  count(): number;
  wait(match: (signal: JobSignal, index: number) => boolean, abort: AbortSignal): Promise<JobSignal>;
}

export interface PromptLoopContext {
  agent: PromptAgent;
  /** The agents it may hand off to: with any, it has the `handoff` tool. */
  handoffs: readonly string[];
  /** The job's signals: an approval is one (`approve` or `deny`). */
  signals: JobSignals;
  input: unknown;
  attempt: number;
  sandbox: Sandbox;
  /** The agent's environment, which tool commands get. */
  env: Record<string, string>;
  /** The gateway's base URLs and the attempt's token (AttemptModels). */
  modelEnv: Record<string, string>;
  signal: AbortSignal;
  attemptLease?: AttemptLease | undefined;
  checkpoints: Checkpoints;
  /** Publishes a `step`, `tool_call` or `tool_result` event. */
  event(type: LoopEventType, step: HarnessStep, message: string): void;
  /** The model's text as it streams (the job's stdout, for followers). */
  onText(text: string): void;
  progress(message: string): void;
  log: Logger;
}

export interface PromptLoopEnd {
  /** The model's last answer, when it ended by answering. */
  text?: string;
  steps: number;
  tokens: { in: number; out: number };
  /** Why the loop ended without an answer (a guard). */
  error?: { code: ErrorCode; message: string };
  /** The model handed the work on (its `handoff` tool): the job's handoff request. */
  handoff?: HandoffRequest;
}

/** The tool an agent with handoffs has: it ends the loop, handing the work to another agent. */
const HANDOFF = "handoff";

/** Tools that can change the workspace: after one, the workspace is kept with the checkpoint. */
const CHANGES_FILES = new Set<string>(["bash", "write_file", "edit_file"]);

export async function runPromptLoop(ctx: PromptLoopContext): Promise<PromptLoopEnd> {
  const { agent } = ctx;
  const prompt = await renderPrompt(agent.template, ctx.input);
  const model = languageModel(agent.model, ctx.modelEnv);
  const tools: ToolSet = Object.fromEntries(
    agent.tools.map((name: BuiltinTool) => [
      name,
      tool({ description: TOOL_DESCRIPTIONS[name], inputSchema: jsonSchema(toolSchema(name)) }),
    ]),
  );
  if (ctx.handoffs.length > 0) tools[HANDOFF] = handoffTool(ctx.handoffs);
  const state = await resume(ctx);
  // MCP servers in the sandbox: their tools too, for the loop's life.
  const mcp = await startMcpServers(agent.mcp, ctx);
  Object.assign(tools, mcp.tools);
  try {
    return await loop(ctx, { prompt, model, tools, state, mcp });
  } finally {
    await mcp.close();
  }
}

/** The loop itself, from `state`, until an answer, a handoff or a guard. */
async function loop(
  ctx: PromptLoopContext,
  {
    prompt,
    model,
    tools,
    state,
    mcp,
  }: { prompt: Awaited<ReturnType<typeof renderPrompt>>; model: LanguageModel; tools: ToolSet; state: LoopState; mcp: McpServers },
): Promise<PromptLoopEnd> {
  const { agent } = ctx;
  const save = async () => {
    if (ctx.attemptLease?.lapsed())
      throw new BoxcarError(ErrorCode.cancelled, "the attempt's lease lapsed: another attempt may own the job");
    await ctx.checkpoints.save(state);
  };
  for (;;) {
    // The last answer's tool calls that have no result yet (on a resumed attempt: the one under way).
    const calls = unanswered(state.messages);
    for (const call of calls) {
      const ended = call.toolName === HANDOFF && ctx.handoffs.length > 0 ? handOff(ctx, state, call) : await runCall(ctx, state, call, mcp);
      if (ended) return ended;
      if ((CHANGES_FILES.has(call.toolName) || mcp.has(call.toolName)) && !(await ctx.checkpoints.saveWorkspace(ctx.sandbox))) {
        ctx.progress("the workspace is too large to keep with the checkpoint: a later attempt starts it from the job's input");
      }
      await save();
    }
    if (calls.length > 0) {
      const stuck = noProgress(ctx, state);
      if (stuck) return stuck;
    }
    const last = state.messages.at(-1);
    if (last?.role === "assistant") return { text: textOf(last), steps: state.steps, tokens: state.tokens };
    if (state.steps >= agent.maxSteps) {
      return end(state, ErrorCode.maxSteps, `the agent made its ${agent.maxSteps} model calls (maxSteps) without a final answer`);
    }
    if (agent.maxTokens !== undefined && state.tokens.in + state.tokens.out >= agent.maxTokens) {
      return end(
        state,
        ErrorCode.maxTokens,
        `the agent used ${state.tokens.in + state.tokens.out} tokens, its maxTokens of ${agent.maxTokens}, without a final answer`,
      );
    }
    if (agent.compactAt !== undefined && (state.lastPromptTokens ?? 0) >= agent.compactAt && (await compact(ctx, state, model, prompt))) {
      await save();
    }
    const n = state.steps + 1;
    const result = streamText({
      model,
      ...(prompt.system ? { system: prompt.system } : {}),
      messages: [...prompt.messages, ...state.messages],
      ...(Object.keys(tools).length > 0 ? { tools } : {}),
      maxOutputTokens: agent.maxOutputTokens,
      ...(agent.temperature !== undefined ? { temperature: agent.temperature } : {}),
      abortSignal: ctx.signal,
    });
    let failure: unknown;
    // Calls the SDK itself answers with an error (a tool that does not exist): the model is told so in the answer's messages.
    const refused: { id: string; name: string; input: unknown; error: unknown }[] = [];
    for await (const part of result.fullStream) {
      if (part.type === "text-delta") ctx.onText(part.text);
      else if (part.type === "error") failure = part.error;
      else if (part.type === "tool-error") refused.push({ id: part.toolCallId, name: part.toolName, input: part.input, error: part.error });
    }
    if (failure) throw modelError(failure);
    const [response, finish, usage] = await Promise.all([result.response, result.finishReason, result.usage]);
    state.steps = n;
    state.tokens = { in: state.tokens.in + (usage.inputTokens ?? 0), out: state.tokens.out + (usage.outputTokens ?? 0) };
    state.lastPromptTokens = usage.inputTokens ?? 0;
    state.messages.push(...(response.messages as ModelMessage[]));
    const answer = state.messages.at(-1);
    const text = answer?.role === "assistant" ? textOf(answer) : "";
    ctx.event(
      "step",
      { n, finish, ...(text ? { text: excerpt(text) } : {}) },
      `step ${n}: ${finish}${text ? `: ${excerpt(text, 200)}` : ""}`,
    );
    for (const call of refused) {
      const tool = { id: call.id, name: call.name, input: excerpt(JSON.stringify(call.input ?? {})) };
      const why = call.error instanceof Error ? call.error.message : String(call.error);
      ctx.event("tool_call", { n, tool }, `step ${n}: ${call.name} ${excerpt(tool.input, 200)}`);
      ctx.event(
        "tool_result",
        { n, tool: { ...tool, output: excerpt(why), error: true, durationMs: 0 } },
        `step ${n}: ${call.name} failed: ${excerpt(why, 200)}`,
      );
    }
    ctx.onText("\n");
    await save();
  }
}

/** What the model is asked when the conversation is compacted. */
const COMPACT_ASK =
  "Summarise the work so far for yourself, to go on from it: what was asked, what was done (files written, commands run and their results that matter), what was found, and what is left. Be complete but brief; the messages before this one will be replaced by your summary.";

/**
 * Replaces the steps before the last `keepSteps` with a summary the model writes of them (a model
 * call through the gateway like any, not a step); false when there was nothing old enough.
 */
async function compact(
  ctx: PromptLoopContext,
  state: LoopState,
  model: LanguageModel,
  prompt: { system?: string; messages: ModelMessage[] },
): Promise<boolean> {
  const starts = state.messages.flatMap((m, i) => (m.role === "assistant" ? [i] : []));
  const cut = starts[starts.length - ctx.agent.keepSteps];
  if (cut === undefined || cut === 0) return false;
  const older = state.messages.slice(0, cut);
  const summary = streamText({
    model,
    ...(prompt.system ? { system: prompt.system } : {}),
    messages: [...prompt.messages, ...older, { role: "user", content: COMPACT_ASK }],
    maxOutputTokens: ctx.agent.maxOutputTokens,
    abortSignal: ctx.signal,
  });
  let failure: unknown;
  for await (const part of summary.fullStream) if (part.type === "error") failure = part.error;
  if (failure) throw modelError(failure);
  const [text, usage] = await Promise.all([summary.text, summary.usage]);
  state.tokens = { in: state.tokens.in + (usage.inputTokens ?? 0), out: state.tokens.out + (usage.outputTokens ?? 0) };
  state.messages = [
    { role: "user", content: `A summary of the earlier steps, which were compacted:\n\n${text}` },
    ...state.messages.slice(cut),
  ];
  state.lastPromptTokens = 0;
  ctx.event(
    "compacted",
    { n: state.steps, text: excerpt(text) },
    `compacted ${older.length} messages of the conversation into a summary of ${text.length} characters, keeping the last ${ctx.agent.keepSteps} steps whole`,
  );
  return true;
}

/** The checkpoint of an earlier attempt, its workspace laid out again; or a new state. */
async function resume(ctx: PromptLoopContext): Promise<LoopState> {
  const kept = ctx.attempt > 1 ? await ctx.checkpoints.load() : undefined;
  if (!kept) return { v: 1, attempt: ctx.attempt, steps: 0, messages: [], tokens: { in: 0, out: 0 }, repeated: { key: "", count: 0 } };
  const restored = kept.workspace ? await restoreWorkspace(ctx.sandbox, kept.workspace) : 0;
  ctx.progress(
    `resumed at step ${kept.state.steps} from attempt ${kept.state.attempt}'s checkpoint (${kept.state.messages.length} messages, ${restored} files of its workspace)`,
  );
  return { ...kept.state, attempt: ctx.attempt };
}

/** Runs one tool call and adds its result; a doom loop ends the loop instead. */
async function runCall(ctx: PromptLoopContext, state: LoopState, call: ToolCallPart, mcp: McpServers): Promise<PromptLoopEnd | undefined> {
  const n = state.steps;
  const input = JSON.stringify(call.input ?? {});
  const key = `${call.toolName} ${input}`;
  state.repeated = key === state.repeated.key ? { key, count: state.repeated.count + 1 } : { key, count: 1 };
  const limit = ctx.agent.doomLoop;
  if (state.repeated.count > limit) {
    return end(
      state,
      ErrorCode.doomLoop,
      `the model asked for ${call.toolName} with the same arguments ${state.repeated.count} times in a row, after it was told at the ${limit}th (doomLoop)`,
    );
  }
  const tool = { id: call.toolCallId, name: call.toolName, input: excerpt(input) };
  ctx.event("tool_call", { n, tool }, `step ${n}: ${call.toolName} ${excerpt(input, 200)}`);
  const denied = (ctx.agent.approval as readonly string[]).includes(call.toolName) ? await approval(ctx, state, call, tool) : undefined;
  const started = performance.now();
  const answer = denied
    ? { output: denied, error: true }
    : state.repeated.count === limit
      ? {
          output: `you have asked for ${call.toolName} with these same arguments ${limit} times in a row, and it was not run again: the result will not change. Try something else; asking once more ends the job.`,
          error: true,
        }
      : mcp.has(call.toolName)
        ? await mcp.call(call.toolName, call.input, ctx.signal)
        : await runTool(call.toolName, call.input, {
            sandbox: ctx.sandbox,
            env: ctx.env,
            signal: ctx.signal,
            callId: call.toolCallId,
            ...(ctx.attemptLease ? { attemptLease: ctx.attemptLease } : {}),
          });
  const durationMs = Math.round(performance.now() - started);
  ctx.event(
    "tool_result",
    { n, tool: { ...tool, output: excerpt(answer.output), ...(answer.error ? { error: true } : {}), durationMs } },
    `step ${n}: ${call.toolName} ${answer.error ? "failed" : "done"} in ${durationMs} ms`,
  );
  state.messages.push(toolResult(call, answer));
  return undefined;
}

function handoffTool(handoffs: readonly string[]) {
  return tool({
    description: `Hands the work on to another agent, which starts with this job's output files (out/) unless carryFiles is false, and ends this job: use it as your last step. The agents: ${handoffs.join(", ")}.`,
    inputSchema: jsonSchema({
      type: "object",
      properties: {
        to: { type: "string", enum: [...handoffs] },
        input: { description: "the next job's input (JSON)" },
        carryFiles: { type: "boolean" },
        summary: { type: "string", description: "what this job did, for the next agent and for people" },
      },
      required: ["to"],
      additionalProperties: false,
    }),
  });
}

/** The model's handoff: the loop ends, the job's result asks for it (the dispatcher checks it against the agent's handoffs). */
function handOff(ctx: PromptLoopContext, state: LoopState, call: ToolCallPart): PromptLoopEnd | undefined {
  const n = state.steps;
  const asked = (call.input ?? {}) as { to?: unknown; input?: unknown; carryFiles?: unknown; summary?: unknown };
  const tool = { id: call.toolCallId, name: HANDOFF, input: excerpt(JSON.stringify(asked)) };
  ctx.event("tool_call", { n, tool }, `step ${n}: handoff ${excerpt(tool.input, 200)}`);
  const to = typeof asked.to === "string" && ctx.handoffs.includes(asked.to) ? asked.to : undefined;
  if (!to) {
    const output = `handoff needs \`to\`, one of ${ctx.handoffs.join(", ")}`;
    ctx.event("tool_result", { n, tool: { ...tool, output, error: true, durationMs: 0 } }, `step ${n}: handoff failed: ${output}`);
    state.messages.push(toolResult(call, { output, error: true }));
    return undefined;
  }
  const summary = typeof asked.summary === "string" ? asked.summary : `handed off to ${to}`;
  ctx.event("tool_result", { n, tool: { ...tool, output: `handing off to ${to}`, durationMs: 0 } }, `step ${n}: handing off to ${to}`);
  return {
    text: summary,
    steps: state.steps,
    tokens: state.tokens,
    handoff: { to, input: (asked.input ?? null) as HandoffRequest["input"], carryFiles: asked.carryFiles !== false, stayInSession: false },
  };
}

function toolResult(call: ToolCallPart, answer: { output: string; error: boolean }): ModelMessage {
  return {
    role: "tool",
    content: [
      {
        type: "tool-result",
        toolCallId: call.toolCallId,
        toolName: call.toolName,
        output: answer.error ? { type: "error-text", value: answer.output } : { type: "text", value: answer.output },
      },
    ],
  };
}

/**
 * Waits for a person's decision on a call of a tool that needs one: a signal `approve` or `deny`
 * whose payload names the call (`{"call": ID}`), or names none and came after the request. The
 * decision is kept in the checkpoint, so a resumed attempt does not ask again. Returns why the
 * call was denied, or undefined when it may run.
 */
async function approval(
  ctx: PromptLoopContext,
  state: LoopState,
  call: ToolCallPart,
  tool: { id: string; name: string; input: string },
): Promise<string | undefined> {
  state.approvals ??= {};
  let decision = state.approvals[call.toolCallId];
  if (!decision) {
    const from = ctx.signals.count();
    const n = state.steps;
    ctx.event(
      "approval_requested",
      { n, tool },
      `step ${n}: ${call.toolName} waits for approval: boxcar signal JOB approve --payload '{"call":"${call.toolCallId}"}' (or deny, with a "reason")`,
    );
    await ctx.checkpoints.save(state);
    const signal = await ctx.signals.wait((s, index) => {
      if (s.name !== "approve" && s.name !== "deny") return false;
      const named = (s.payload as { call?: unknown } | null)?.call;
      return named === call.toolCallId || (named === undefined && index >= from);
    }, ctx.signal);
    const reason = (signal.payload as { reason?: unknown } | null)?.reason;
    decision = { approved: signal.name === "approve", ...(typeof reason === "string" ? { reason: reason.slice(0, 1024) } : {}) };
    state.approvals[call.toolCallId] = decision;
    await ctx.checkpoints.save(state);
  }
  return decision.approved ? undefined : `a person denied this call${decision.reason ? `: ${decision.reason}` : ""}; it did not run`;
}

/**
 * No progress: the steps in a row whose tool calls all failed. At `stuckSteps` the model is told
 * (a note after the step's results); two steps more like them end the loop `doom_loop`.
 */
function noProgress(ctx: PromptLoopContext, state: LoopState): PromptLoopEnd | undefined {
  const at = state.messages.findLastIndex((m) => m.role === "assistant");
  const results = state.messages
    .slice(at + 1)
    .flatMap((m) => (m.role === "tool" ? m.content : []))
    .flatMap((p) => (p.type === "tool-result" ? [p] : []));
  const failed = results.length > 0 && results.every((r) => r.output.type === "error-text");
  state.failingSteps = failed ? (state.failingSteps ?? 0) + 1 : 0;
  const limit = ctx.agent.stuckSteps;
  if (state.failingSteps >= limit + 2) {
    return end(
      state,
      ErrorCode.doomLoop,
      `the last ${state.failingSteps} steps' tool calls all failed, after the model was told at the ${limit}th (stuckSteps): no progress`,
    );
  }
  if (state.failingSteps === limit) {
    state.messages.push({
      role: "user",
      content: `The tool calls of your last ${limit} steps all failed. Stop and change your approach, or give your answer with what you have: two more steps like these end the job.`,
    });
  }
  return undefined;
}

/** The tool calls of the last answer that no tool message after it answers. */
function unanswered(messages: readonly ModelMessage[]): ToolCallPart[] {
  const at = messages.findLastIndex((m) => m.role === "assistant");
  const answer = messages[at];
  if (!answer || typeof answer.content === "string") return [];
  const answered = new Set(
    messages
      .slice(at + 1)
      .flatMap((m) => (m.role === "tool" ? m.content : []))
      .flatMap((p) => (p.type === "tool-result" ? [p.toolCallId] : [])),
  );
  return answer.content.filter((p): p is ToolCallPart => p.type === "tool-call" && !answered.has(p.toolCallId));
}

function textOf(message: ModelMessage): string {
  if (typeof message.content === "string") return message.content;
  return message.content.flatMap((p) => (p.type === "text" ? [p.text] : [])).join("");
}

function end(state: LoopState, code: ErrorCode, message: string): PromptLoopEnd {
  return { steps: state.steps, tokens: state.tokens, error: { code, message } };
}

function excerpt(text: string, max = STEP_EXCERPT): string {
  return text.length <= max ? text : `${text.slice(0, max)}... (${text.length - max} more characters)`;
}

/** The model, called through the worker's gateway with the attempt's token. */
function languageModel(ref: string, env: Record<string, string>): LanguageModel {
  const { provider, model } = modelOf(ref);
  if (provider === "anthropic") {
    return createAnthropic({ baseURL: `${env.ANTHROPIC_BASE_URL}/v1`, apiKey: env.ANTHROPIC_API_KEY ?? "" })(model);
  }
  return createOpenAI({ baseURL: env.OPENAI_BASE_URL, apiKey: env.OPENAI_API_KEY ?? "" }).chat(model);
}

/** A model call that failed (after the SDK's own retries): the attempt fails, and a retry resumes from the checkpoint. */
function modelError(err: unknown): BoxcarError {
  const status = (err as { statusCode?: number }).statusCode;
  const message = (err as Error).message ?? String(err);
  return new BoxcarError(ErrorCode.agentFailed, `the model call failed${status ? ` (${status})` : ""}: ${message}`);
}
