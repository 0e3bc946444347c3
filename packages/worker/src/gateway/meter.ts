import type { ModelProvider } from "@boxcar/protocol";
import { MODEL_NAME } from "@boxcar/protocol/internal";

/**
 * What one call used, read from the provider's answer as it passes through: a JSON body, or a
 * stream of server-sent events. Tokens in are all the prompt's tokens (Anthropic reports the
 * cached ones apart from `input_tokens`: they are added in, and also kept apart); tokens out are
 * the answer's.
 */
export interface Metered {
  model?: string;
  tokensIn: number;
  tokensOut: number;
  cacheReadTokens?: number;
  cacheWriteTokens?: number;
}

const count = (value: unknown): number => (typeof value === "number" && Number.isInteger(value) && value >= 0 ? value : 0);
const record = (value: unknown): Record<string, unknown> =>
  value !== null && typeof value === "object" ? (value as Record<string, unknown>) : {};

/** Adds what one usage object says (any of the providers' shapes) to `into`. */
function readUsageInto(into: Metered, usage: Record<string, unknown>): void {
  // Anthropic: input_tokens (uncached), cache_read_input_tokens, cache_creation_input_tokens, output_tokens.
  // OpenAI Chat Completions: prompt_tokens (all), prompt_tokens_details.cached_tokens, completion_tokens.
  // OpenAI Responses: input_tokens (all), input_tokens_details.cached_tokens, output_tokens.
  const cacheRead = count(usage.cache_read_input_tokens);
  const cacheWrite = count(usage.cache_creation_input_tokens);
  if ("prompt_tokens" in usage) {
    into.tokensIn = count(usage.prompt_tokens);
    into.tokensOut = count(usage.completion_tokens);
    const cached = count(record(usage.prompt_tokens_details).cached_tokens);
    if (cached) into.cacheReadTokens = cached;
    return;
  }
  if ("input_tokens_details" in usage) {
    into.tokensIn = count(usage.input_tokens);
    into.tokensOut = count(usage.output_tokens);
    const cached = count(record(usage.input_tokens_details).cached_tokens);
    if (cached) into.cacheReadTokens = cached;
    return;
  }
  // Anthropic's stream reports input at its start and output at its end: keep the larger of each.
  if ("input_tokens" in usage || cacheRead || cacheWrite) {
    into.tokensIn = Math.max(into.tokensIn, count(usage.input_tokens) + cacheRead + cacheWrite);
    if (cacheRead) into.cacheReadTokens = cacheRead;
    if (cacheWrite) into.cacheWriteTokens = cacheWrite;
  }
  if ("output_tokens" in usage) into.tokensOut = Math.max(into.tokensOut, count(usage.output_tokens));
}

function noteModel(into: Metered, value: unknown): void {
  if (typeof value === "string" && MODEL_NAME.test(value)) into.model = value;
}

/** Reads one answer object (a whole JSON body, or one event's data) into `into`. */
function read(provider: ModelProvider, into: Metered, data: Record<string, unknown>): void {
  if (provider === "anthropic") {
    // A whole message, or the stream's message_start (its message) and message_delta (usage at the top).
    const message = data.type === "message_start" ? record(data.message) : data;
    noteModel(into, message.model);
    if (message.usage) readUsageInto(into, record(message.usage));
    return;
  }
  // OpenAI: a chat completion or chunk (model, usage on the last chunk), or a response or a
  // Responses stream event that carries one (response.completed).
  const response = data.response !== undefined ? record(data.response) : data;
  noteModel(into, response.model);
  if (response.usage) readUsageInto(into, record(response.usage));
}

/** What a whole JSON answer says; a body that is not JSON says nothing. */
export function meterJson(provider: ModelProvider, body: string): Metered {
  const metered: Metered = { tokensIn: 0, tokensOut: 0 };
  try {
    read(provider, metered, record(JSON.parse(body)));
  } catch {
    // Not JSON (an error page, say): nothing to count.
  }
  return metered;
}

/**
 * Reads a stream of server-sent events as it passes, chunk by chunk, without holding it: only
 * the line being read is kept. Each `data:` line that is JSON is read for its model and usage.
 */
export class SseMeter {
  readonly metered: Metered = { tokensIn: 0, tokensOut: 0 };
  private partial = "";
  private readonly decoder = new TextDecoder();

  constructor(private readonly provider: ModelProvider) {}

  push(chunk: Uint8Array): void {
    const text = this.partial + this.decoder.decode(chunk, { stream: true });
    const lines = text.split("\n");
    this.partial = lines.pop() ?? "";
    // A line longer than any event carries (a runaway answer with no newline) is dropped, not kept.
    if (this.partial.length > 1 << 20) this.partial = "";
    for (const line of lines) this.line(line.endsWith("\r") ? line.slice(0, -1) : line);
  }

  end(): Metered {
    if (this.partial) this.line(this.partial);
    this.partial = "";
    return this.metered;
  }

  private line(line: string): void {
    if (!line.startsWith("data:")) return;
    const data = line.slice(5).trim();
    if (!data.startsWith("{")) return; // [DONE], or nothing
    try {
      read(this.provider, this.metered, record(JSON.parse(data)));
    } catch {
      // Not JSON: skipped.
    }
  }
}
