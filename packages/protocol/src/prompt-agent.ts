import { z } from "zod";
import type { AgentModels, ModelProvider } from "./models.js";

/**
 * Prompt agents (docs/harness.md): an agent defined by a prompt, a model and tools instead of a
 * command. Its loop runs in the worker, its model calls go through the worker's model gateway,
 * and each tool call runs in the job's sandbox.
 */

/** The tools the harness has built in, each run inside the job's sandbox. */
export const BUILTIN_TOOLS = ["bash", "read_file", "write_file", "edit_file", "list_files", "grep"] as const;
export const BuiltinTool = z.enum(BUILTIN_TOOLS, {
  error: (issue) => `unknown tool ${JSON.stringify(issue.input)}: the built-in tools are ${BUILTIN_TOOLS.join(", ")}`,
});
export type BuiltinTool = z.infer<typeof BuiltinTool>;

/** `provider/model`: the provider whose gateway route the calls take, and the model's own name. */
export const ModelRef = z
  .string()
  .regex(
    /^(anthropic|openai)\/[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$/,
    "must be provider/model, the provider anthropic or openai (e.g. anthropic/claude-sonnet-4-5, openai/gpt-4o-mini)",
  );

export const PromptAgent = z
  .strictObject({
    model: ModelRef.describe("the model its loop calls, as provider/model (anthropic/..., openai/...)"),
    template: z
      .string()
      .min(1, "the prompt's template is empty")
      .max(256 * 1024)
      .describe('the prompt: a Dotprompt (Handlebars) template the job\'s input fills; `{{role "system"}}` starts a system part'),
    tools: z.array(BuiltinTool).max(BUILTIN_TOOLS.length).default([]).describe("the built-in tools it may call, each run in its sandbox"),
    mcp: z
      .array(
        z.strictObject({
          name: z
            .string()
            .regex(/^[a-z][a-z0-9-]{0,15}$/, "1 to 16 of a-z 0-9 -, starting with a letter")
            .describe("its tools are named <name>__<tool>"),
          command: z.array(z.string().min(1)).min(1).describe("how to start it, in the sandbox: it speaks MCP on its stdin and stdout"),
          env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/), z.string().max(32_768)).default({}),
        }),
      )
      .max(8)
      .refine((servers) => new Set(servers.map((s) => s.name)).size === servers.length, "two MCP servers have the same name")
      .default([])
      .describe("MCP servers started inside the job's sandbox (stdio): their tools are the agent's too"),
    approval: z
      .array(BuiltinTool)
      .max(BUILTIN_TOOLS.length)
      .default([])
      .describe("tools whose every call waits for a person's approval (a signal `approve` or `deny` to the job) before it runs"),
    maxSteps: z.number().int().min(1).max(1_000).default(25).describe("the most model calls its loop makes; past them it ends `max_steps`"),
    maxTokens: z
      .number()
      .int()
      .positive()
      .optional()
      .describe("the most tokens (in and out) its loop may use over the job; past them it ends `max_tokens`"),
    maxOutputTokens: z.number().int().min(1).max(200_000).default(4_096).describe("the most tokens of one model answer"),
    temperature: z.number().min(0).max(2).optional(),
    compactAt: z
      .number()
      .int()
      .min(1)
      .optional()
      .describe(
        "when a model call's prompt reaches this many tokens, the steps before the last `keepSteps` are summarised through the model and replaced by the summary (a `compacted` event); absent: never",
      ),
    keepSteps: z.number().int().min(1).max(100).default(4).describe("the most recent steps a compaction keeps whole"),
    stuckSteps: z
      .number()
      .int()
      .min(2)
      .max(100)
      .default(6)
      .describe(
        "this many steps in a row whose tool calls all failed (no progress): the model is told; two more, the loop ends `doom_loop`",
      ),
    doomLoop: z
      .number()
      .int()
      .min(2)
      .max(20)
      .default(3)
      .describe(
        "the same tool call with the same arguments this many times in a row: the model is told; once more, the loop ends `doom_loop`",
      ),
  })
  .refine((prompt) => prompt.approval.every((tool) => prompt.tools.includes(tool)), {
    message: "a tool that waits for approval must be one of the agent's tools",
    path: ["approval"],
  });
export type PromptAgent = z.infer<typeof PromptAgent>;

/** The provider and model of a `provider/model` reference. */
export function modelOf(ref: string): { provider: ModelProvider; model: string } {
  const at = ref.indexOf("/");
  return { provider: ref.slice(0, at) as ModelProvider, model: ref.slice(at + 1) };
}

/** The providers an agent calls through the gateway: its `models`, or a prompt agent's model's provider. */
export function modelsOfAgent(agent: { models?: AgentModels | undefined; prompt?: PromptAgent | undefined }): AgentModels | undefined {
  if (agent.models) return agent.models;
  return agent.prompt ? { providers: [modelOf(agent.prompt.model).provider], record: false } : undefined;
}

/** The Object Store objects a prompt agent's loop keeps for its job: its last checkpoint and its workspace at that point. */
export function harnessObjects(jobId: string): { state: string; workspace: string } {
  return { state: `harness/${jobId}/state`, workspace: `harness/${jobId}/workspace.tar` };
}

/** The most of a tool call's arguments, a tool's output or a model's text an event carries; the rest is cut, saying so. */
export const STEP_EXCERPT = 4096;

/** What a `step`, `tool_call` or `tool_result` event says of a prompt agent's loop. */
export const HarnessStep = z.strictObject({
  n: z.number().int().positive().describe("the step: its model call's number, from 1"),
  finish: z.string().max(64).optional().describe("on `step`: why the model's answer ended (`tool-calls`, `stop`, `length`, ...)"),
  text: z
    .string()
    .max(STEP_EXCERPT + 64)
    .optional()
    .describe("on `step`: the model's text, the first 4 KiB"),
  tool: z
    .strictObject({
      id: z.string().max(256),
      name: z.string().max(128),
      input: z
        .string()
        .max(STEP_EXCERPT + 64)
        .describe("its arguments as JSON, the first 4 KiB"),
      output: z
        .string()
        .max(STEP_EXCERPT + 64)
        .optional()
        .describe("on `tool_result`: what the model was given, the first 4 KiB"),
      error: z.boolean().optional().describe("on `tool_result`: the tool failed (the model is told why)"),
      durationMs: z.number().nonnegative().optional(),
    })
    .optional(),
});
export type HarnessStep = z.infer<typeof HarnessStep>;
