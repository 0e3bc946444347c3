import type { IncomingMessage } from "node:http";
import type { ProviderWire } from "./providers.js";

/** What the gateway reads of the bodies it passes on: requests whole, answers as they stream. */

/**
 * Passes a Chat Completions stream on event by event, leaving out the chunk that carries only
 * the usage (no choices): an event is held until its blank line has come.
 */
export class UsageChunkFilter {
  private held = "";
  private readonly decoder = new TextDecoder();

  push(chunk: Buffer): Buffer {
    this.held += this.decoder.decode(chunk, { stream: true });
    const end = this.held.lastIndexOf("\n\n");
    if (end < 0) return EMPTY;
    const events = this.held.slice(0, end + 2);
    this.held = this.held.slice(end + 2);
    return Buffer.from(
      events
        .split(/(?<=\n\n)/)
        .filter((event) => !isUsageOnly(event))
        .join(""),
    );
  }

  end(): Buffer {
    const rest = this.held + this.decoder.decode();
    this.held = "";
    return Buffer.from(isUsageOnly(rest) ? "" : rest);
  }
}

const EMPTY = Buffer.alloc(0);

function isUsageOnly(event: string): boolean {
  const data = event
    .split("\n")
    .find((line) => line.startsWith("data:"))
    ?.slice(5)
    .trim();
  if (!data?.startsWith("{")) return false;
  try {
    const chunk = JSON.parse(data) as { choices?: unknown[]; usage?: unknown };
    return Array.isArray(chunk.choices) && chunk.choices.length === 0 && chunk.usage != null;
  } catch {
    return false;
  }
}

/** The largest answer recorded for replay; a longer one is passed on but not recorded. */
export const MAX_RECORDED_BODY = 16 * 1024 * 1024;

/** The most of a JSON answer kept to read its usage (usage comes at its end, so all of it up to this). */
export const MAX_METERED_BODY = 64 * 1024 * 1024;

/** The whole request body, or undefined past `max` bytes. */
export async function readBody(req: IncomingMessage, max: number): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > max) return undefined;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

/**
 * What the gateway reads of a request: the model asked for and whether the answer streams. A
 * streamed Chat Completions request is asked to report its usage at its end
 * (`stream_options.include_usage`), else OpenAI sends none; the rest of the body goes as it came.
 */
export function parseRequest(
  wire: ProviderWire,
  rest: string,
  body: Buffer,
): { body: Buffer; model?: string; stream: boolean; usageAsked?: boolean } {
  let parsed: Record<string, unknown>;
  try {
    const value: unknown = JSON.parse(body.toString("utf8"));
    if (value === null || typeof value !== "object" || Array.isArray(value)) return { body, stream: false };
    parsed = value as Record<string, unknown>;
  } catch {
    return { body, stream: false }; // not JSON: the provider answers it
  }
  const stream = parsed.stream === true;
  const model = typeof parsed.model === "string" ? parsed.model : undefined;
  const base = { stream, ...(model ? { model } : {}) };
  if (wire.name === "openai" && stream && rest.startsWith("/chat/completions")) {
    const options = (parsed.stream_options ?? {}) as Record<string, unknown>;
    if (options.include_usage !== true) {
      const asked = Buffer.from(JSON.stringify({ ...parsed, stream_options: { ...options, include_usage: true } }));
      return { ...base, body: asked, usageAsked: true };
    }
  }
  return { ...base, body };
}
