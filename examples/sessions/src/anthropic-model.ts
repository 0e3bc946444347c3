import { type Model, TOOLS, type ToolCall, type Turn } from "./agent-loop.js";

/**
 * A real model through Anthropic's Messages API with tool use. Used by main.ts when
 * ANTHROPIC_API_KEY is set. Not run here: this machine reaches no model API, so it is written
 * from the API's documentation and has not been tried against it.
 */
export function anthropicModel(opts: { apiKey: string; model: string; endpoint?: string }): Model {
  const endpoint = opts.endpoint ?? "https://api.anthropic.com/v1/messages";
  return {
    async next(turns: readonly Turn[]) {
      const response = await fetch(endpoint, {
        method: "POST",
        headers: { "content-type": "application/json", "x-api-key": opts.apiKey, "anthropic-version": "2023-06-01" },
        body: JSON.stringify({ model: opts.model, max_tokens: 2048, tools: TOOLS, messages: turns.map(toMessage) }),
      });
      if (!response.ok) throw new Error(`the model API answered ${response.status}: ${(await response.text()).slice(0, 500)}`);
      const body = (await response.json()) as {
        content: Array<{ type: string; text?: string; id?: string; name?: string; input?: unknown }>;
      };
      const text = body.content.flatMap((b) => (b.type === "text" && b.text ? [b.text] : [])).join("\n");
      const calls = body.content.flatMap((b) => (b.type === "tool_use" ? [{ id: b.id, name: b.name, input: b.input } as ToolCall] : []));
      return { text, calls };
    },
  };
}

/** A turn as a message of the API: tool calls as `tool_use` blocks, their results as `tool_result` blocks of a user message. */
function toMessage(turn: Turn) {
  switch (turn.role) {
    case "user":
      return { role: "user", content: turn.text };
    case "assistant":
      return {
        role: "assistant",
        content: [
          ...(turn.text ? [{ type: "text", text: turn.text }] : []),
          ...turn.calls.map((c) => ({ type: "tool_use", id: c.id, name: c.name, input: c.input })),
        ],
      };
    case "tools":
      return {
        role: "user",
        content: turn.results.map((r) => ({ type: "tool_result", tool_use_id: r.id, content: r.output, is_error: r.isError })),
      };
  }
}
