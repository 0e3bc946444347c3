import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A scripted stand-in for the model providers, speaking their real wire formats (no model API
 * is reachable here): Anthropic's Messages API and OpenAI's Chat Completions and Responses APIs,
 * each as one JSON body or as server-sent events, with the usage each reports. It answers every
 * request from its script (by default a fixed answer) and keeps each request it got.
 */

export interface StandInRequest {
  path: string;
  headers: IncomingHttpHeaders;
  body: Record<string, unknown>;
}

/**
 * What to answer next: a normal answer (text, or a call of `tool` with `input`, by default
 * `{path: "README.md"}`), an error status (429 with retry-after, 5xx), a stall before the first
 * byte, or a stream cut off midway.
 */
export type Scripted =
  | { kind: "answer"; text?: string; tool?: string; input?: Record<string, unknown>; id?: string }
  | { kind: "error"; status: number; retryAfter?: number }
  | { kind: "hang" };

export interface ModelStandIn extends AsyncDisposable {
  /** Anthropic's base (for ANTHROPIC_BASE_URL-style configuration) and OpenAI's (with its /v1). */
  anthropicUrl: string;
  openaiUrl: string;
  requests: StandInRequest[];
  /** Answers the next requests from this script, in order, before falling back to plain answers. */
  script(...next: Scripted[]): void;
  close(): Promise<void>;
}

export const STANDIN_USAGE = { in: 11, out: 7, cacheRead: 3, cacheWrite: 2 };

export async function startModelStandIn(): Promise<ModelStandIn> {
  const requests: StandInRequest[] = [];
  const queue: Scripted[] = [];
  const server: Server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    let body: Record<string, unknown> = {};
    try {
      body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, unknown>;
    } catch {
      const anthropic = (req.url ?? "").startsWith("/anthropic");
      res.writeHead(400, { "content-type": "application/json" });
      res.end(
        anthropic
          ? JSON.stringify({ type: "error", error: { type: "invalid_request_error", message: "invalid JSON body" } })
          : JSON.stringify({ error: { message: "We could not parse the JSON body of your request.", type: "invalid_request_error" } }),
      );
      return;
    }
    const path = req.url ?? "/";
    requests.push({ path, headers: req.headers, body });
    const step = queue.shift() ?? { kind: "answer" };
    if (step.kind === "hang") return; // never answers: the caller's timeout or cancel ends it
    const anthropic = path.startsWith("/anthropic");
    if (step.kind === "error") {
      const headers: Record<string, string> = { "content-type": "application/json" };
      if (step.retryAfter !== undefined) headers["retry-after"] = String(step.retryAfter);
      res.writeHead(step.status, headers);
      res.end(
        anthropic
          ? JSON.stringify({
              type: "error",
              error: { type: step.status === 429 ? "rate_limit_error" : "api_error", message: `scripted ${step.status}` },
            })
          : JSON.stringify({
              error: { message: `scripted ${step.status}`, type: step.status === 429 ? "rate_limit_exceeded" : "server_error" },
            }),
      );
      return;
    }
    const model = typeof body.model === "string" ? body.model : "stand-in-model";
    const text = step.text ?? "hello from the stand-in";
    const stream = body.stream === true;
    if (anthropic) return anthropicAnswer(res, model, text, stream, step.tool, step.input, step.id);
    if (path.startsWith("/openai/v1/chat/completions")) return chatAnswer(res, model, text, stream, body);
    if (path.startsWith("/openai/v1/responses")) return responsesAnswer(res, model, text, stream);
    res.writeHead(404, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: { message: `no route ${path}`, type: "invalid_request_error" } }));
  });
  await new Promise<void>((ready) => server.listen(0, "127.0.0.1", ready));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const close = () =>
    new Promise<void>((done) => {
      server.close(() => done());
      server.closeAllConnections();
    });
  return {
    anthropicUrl: `${base}/anthropic`,
    openaiUrl: `${base}/openai/v1`,
    requests,
    script: (...next) => queue.push(...next),
    close,
    [Symbol.asyncDispose]: close,
  };
}

type Res = import("node:http").ServerResponse;

function sse(res: Res, events: { event?: string; data: unknown }[]): void {
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  for (const e of events) {
    res.write(`${e.event ? `event: ${e.event}\n` : ""}data: ${typeof e.data === "string" ? e.data : JSON.stringify(e.data)}\n\n`);
  }
  res.end();
}

function anthropicAnswer(
  res: Res,
  model: string,
  text: string,
  stream: boolean,
  tool?: string,
  input: Record<string, unknown> = { path: "README.md" },
  id = "toolu_01",
): void {
  const usage = {
    input_tokens: STANDIN_USAGE.in,
    output_tokens: STANDIN_USAGE.out,
    cache_read_input_tokens: STANDIN_USAGE.cacheRead,
    cache_creation_input_tokens: STANDIN_USAGE.cacheWrite,
  };
  const content = tool ? [{ type: "tool_use", id, name: tool, input }] : [{ type: "text", text }];
  const message = {
    id: "msg_01",
    type: "message",
    role: "assistant",
    model,
    content,
    stop_reason: tool ? "tool_use" : "end_turn",
    stop_sequence: null,
    usage,
  };
  if (!stream) {
    res.writeHead(200, { "content-type": "application/json", "request-id": "req_standin" });
    res.end(JSON.stringify(message));
    return;
  }
  const start = { ...message, content: [], stop_reason: null, usage: { ...usage, output_tokens: 1 } };
  // A tool call streams as its block with an empty input, then the input's JSON in pieces.
  const json = JSON.stringify(input);
  const block = tool
    ? [
        {
          event: "content_block_start",
          data: { type: "content_block_start", index: 0, content_block: { type: "tool_use", id, name: tool, input: {} } },
        },
        ...[json.slice(0, Math.ceil(json.length / 2)), json.slice(Math.ceil(json.length / 2))].map((partial) => ({
          event: "content_block_delta",
          data: { type: "content_block_delta", index: 0, delta: { type: "input_json_delta", partial_json: partial } },
        })),
      ]
    : [
        { event: "content_block_start", data: { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } } },
        ...text.split(" ").map((word, i) => ({
          event: "content_block_delta",
          data: { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: i === 0 ? word : ` ${word}` } },
        })),
      ];
  sse(res, [
    { event: "message_start", data: { type: "message_start", message: start } },
    ...block,
    { event: "content_block_stop", data: { type: "content_block_stop", index: 0 } },
    {
      event: "message_delta",
      data: {
        type: "message_delta",
        delta: { stop_reason: tool ? "tool_use" : "end_turn", stop_sequence: null },
        usage: { output_tokens: STANDIN_USAGE.out },
      },
    },
    { event: "message_stop", data: { type: "message_stop" } },
  ]);
}

function chatAnswer(res: Res, model: string, text: string, stream: boolean, body: Record<string, unknown>): void {
  const usage = {
    prompt_tokens: STANDIN_USAGE.in,
    completion_tokens: STANDIN_USAGE.out,
    total_tokens: STANDIN_USAGE.in + STANDIN_USAGE.out,
    prompt_tokens_details: { cached_tokens: STANDIN_USAGE.cacheRead },
  };
  const created = Math.floor(Date.now() / 1000);
  if (!stream) {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({
        id: "chatcmpl-1",
        object: "chat.completion",
        created,
        model,
        choices: [{ index: 0, message: { role: "assistant", content: text }, finish_reason: "stop" }],
        usage,
      }),
    );
    return;
  }
  const chunk = (delta: unknown, finish: string | null) => ({
    id: "chatcmpl-1",
    object: "chat.completion.chunk",
    created,
    model,
    choices: [{ index: 0, delta, finish_reason: finish }],
    usage: null,
  });
  const includeUsage = (body.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true;
  sse(res, [
    { data: chunk({ role: "assistant", content: "" }, null) },
    ...text.split(" ").map((word, i) => ({ data: chunk({ content: i === 0 ? word : ` ${word}` }, null) })),
    { data: chunk({}, "stop") },
    ...(includeUsage ? [{ data: { id: "chatcmpl-1", object: "chat.completion.chunk", created, model, choices: [], usage } }] : []),
    { data: "[DONE]" },
  ]);
}

function responsesAnswer(res: Res, model: string, text: string, stream: boolean): void {
  const usage = {
    input_tokens: STANDIN_USAGE.in,
    input_tokens_details: { cached_tokens: STANDIN_USAGE.cacheRead },
    output_tokens: STANDIN_USAGE.out,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: STANDIN_USAGE.in + STANDIN_USAGE.out,
  };
  const item = {
    id: "msg_1",
    type: "message",
    status: "completed",
    role: "assistant",
    content: [{ type: "output_text", text, annotations: [] }],
  };
  const response = {
    id: "resp_1",
    object: "response",
    created_at: Math.floor(Date.now() / 1000),
    status: "completed",
    model,
    output: [item],
    usage,
  };
  if (!stream) {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(response));
    return;
  }
  sse(res, [
    {
      event: "response.created",
      data: { type: "response.created", sequence_number: 0, response: { ...response, status: "in_progress", output: [], usage: null } },
    },
    {
      event: "response.output_text.delta",
      data: { type: "response.output_text.delta", sequence_number: 1, item_id: "msg_1", output_index: 0, content_index: 0, delta: text },
    },
    { event: "response.completed", data: { type: "response.completed", sequence_number: 2, response } },
  ]);
}
