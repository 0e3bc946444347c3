import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { ModelMessage } from "ai";
import { Dotprompt } from "dotprompt";

const dotprompt = new Dotprompt();

/**
 * A prompt agent's template filled with the job's input (docs/harness.md#the-prompt): an input
 * that is an object gives its fields as the template's variables; any other input is `{{input}}`.
 * `{{role "system"}}` parts become the system prompt; `{{role "model"}}` parts, the model's turns.
 */
export async function renderPrompt(template: string, input: unknown): Promise<{ system?: string; messages: ModelMessage[] }> {
  const variables = input !== null && typeof input === "object" && !Array.isArray(input) ? (input as Record<string, unknown>) : { input };
  let rendered: Awaited<ReturnType<Dotprompt["render"]>>;
  try {
    rendered = await dotprompt.render(template, { input: variables });
  } catch (err) {
    throw new BoxcarError(ErrorCode.invalid, `the agent's prompt template could not be filled: ${(err as Error).message}`);
  }
  const system: string[] = [];
  const messages: ModelMessage[] = [];
  for (const message of rendered.messages) {
    const text = message.content
      .flatMap((part) => ("text" in part && typeof part.text === "string" ? [part.text] : []))
      .join("")
      .trim();
    if (!text) continue;
    if (message.role === "system") system.push(text);
    else if (message.role === "model") messages.push({ role: "assistant", content: text });
    else messages.push({ role: "user", content: text });
  }
  if (messages.length === 0)
    throw new BoxcarError(ErrorCode.invalid, "the agent's prompt, filled with the job's input, asks nothing: it has no user part");
  return { ...(system.length > 0 ? { system: system.join("\n\n") } : {}), messages };
}
