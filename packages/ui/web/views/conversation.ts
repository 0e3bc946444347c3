/**
 * A prompt agent's conversation (docs/harness.md#events), from its job's `step`, `tool_call` and
 * `tool_result` events: for each step, the model's turn (its text's excerpt and why it ended),
 * then each tool call of that step with its result, collapsed to its name and a line of its
 * arguments until opened. The events reach the page unchecked, so each field is read as what it
 * should be (a string, a number, else nothing) and shown as text.
 */

import type { BoxcarEvent } from "@boxcar/protocol";
import { html } from "../html.js";

/** One tool call as the conversation shows it: its last `tool_call`, and its result once one came. */
interface ToolTurn {
  readonly id: string;
  readonly name: string;
  readonly input: string;
  /** Undefined while the call runs (or when its attempt ended before it did). */
  readonly result: { readonly output: string; readonly error: boolean; readonly durationMs: number | undefined } | undefined;
}

/** One step: the model's answer and the tool calls it asked for. */
interface StepTurn {
  readonly n: number;
  /** The attempt that made the model's call; undefined when only the step's tool calls were seen. */
  attempt: number | undefined;
  /** Why the answer ended (`tool-calls`, `stop`, `length`); empty until the `step` event came. */
  finish: string;
  text: string;
  readonly tools: ToolTurn[];
}

/**
 * The job's steps, from its events (folded ones already unfolded), in the order of their numbers.
 * A tool call that a later attempt ran again (the one under way when its worker died) is one
 * entry, as its latest run left it.
 */
export function conversation(events: readonly BoxcarEvent[]): StepTurn[] {
  const steps = new Map<number, StepTurn>();
  for (const e of events) {
    if (e.kind !== "job" || (e.type !== "step" && e.type !== "tool_call" && e.type !== "tool_result")) continue;
    if (typeof e.step !== "object" || e.step === null) continue;
    const step = e.step as Record<string, unknown>;
    const n = count(step.n);
    if (n === undefined) continue;
    let turn = steps.get(n);
    if (!turn) {
      turn = { n, attempt: undefined, finish: "", text: "", tools: [] };
      steps.set(n, turn);
    }
    if (e.type === "step") {
      turn.attempt = count(e.attempt);
      turn.finish = text(step.finish);
      turn.text = text(step.text);
      continue;
    }
    if (typeof step.tool !== "object" || step.tool === null) continue;
    const tool = step.tool as Record<string, unknown>;
    const id = text(tool.id);
    const result =
      e.type === "tool_result" ? { output: text(tool.output), error: tool.error === true, durationMs: amount(tool.durationMs) } : undefined;
    const call: ToolTurn = { id, name: text(tool.name), input: text(tool.input), result };
    const at = turn.tools.findIndex((t) => t.id === id);
    if (at === -1) turn.tools.push(call);
    else turn.tools[at] = call;
  }
  return [...steps.values()].sort((a, b) => a.n - b.n);
}

/** The conversation of a prompt agent's job; nothing for a job with no loop events. */
export function Conversation({ events }: { events: readonly BoxcarEvent[] }) {
  const steps = conversation(events);
  if (steps.length === 0) return null;
  return html`
    <h2>Conversation</h2>
    <ol class="conversation" data-conversation>
      ${steps.map(
        (s) => html`<li key=${s.n} class="turn" data-step=${s.n}>
          <div class="model-turn">
            <span class="actor">step ${s.n} · model</span>
            ${s.finish && html`<span class="finish" data-finish>${s.finish}</span>`}
            ${s.attempt !== undefined && s.attempt > 1 && html`<span class="note">attempt ${s.attempt}</span>`}
          </div>
          ${s.text && html`<p class="text" data-step-text>${s.text}</p>`}
          ${
            s.tools.length > 0 &&
            html`<ul class="tool-calls">
              ${s.tools.map((t) => html`<li key=${t.id}><${ToolCall} call=${t} /></li>`)}
            </ul>`
          }
        </li>`,
      )}
    </ol>
  `;
}

/** A tool call, collapsed to its name, a line of its arguments and how it ended; opened, all of both. */
function ToolCall({ call }: { call: ToolTurn }) {
  const r = call.result;
  const status = !r ? "running…" : `${r.error ? "error" : "done"}${r.durationMs === undefined ? "" : ` in ${Math.round(r.durationMs)} ms`}`;
  // `<details>` keeps whether the reader opened it: no prop of Preact's sets `open`, so a new event does not close it.
  return html`<details class=${r?.error ? "tool-call error" : "tool-call"} data-tool-call=${call.name}>
    <summary>
      <code class="name">${call.name}</code>
      <span class="preview" data-tool-preview>${oneLine(call.input)}</span>
      <span class=${r?.error ? "status error" : "status"} data-tool-status>${status}</span>
    </summary>
    <div class="label">arguments</div>
    <pre data-tool-input>${pretty(call.input)}</pre>
    ${
      r &&
      html`<div class="label">${r.error ? "result: error" : "result"}</div>
      <pre class=${r.error ? "tool-output error" : "tool-output"} data-tool-output data-tool-error=${r.error ? "true" : undefined}>${r.output}</pre>`
    }
  </details>`;
}

/** Arguments as indented JSON when they parse (an excerpt cut at 4 KiB does not), else as they came. */
function pretty(input: string): string {
  try {
    return JSON.stringify(JSON.parse(input), null, 2);
  } catch {
    return input;
  }
}

/** Text on one line, its runs of white space one space, at most 160 characters. */
function oneLine(s: string): string {
  const line = s.replace(/\s+/g, " ").trim();
  return line.length > 160 ? `${line.slice(0, 159)}…` : line;
}

/** A whole number of at least 0, else undefined. */
function count(v: unknown): number | undefined {
  return typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : undefined;
}

/** A finite number of at least 0, else undefined. */
function amount(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) && v >= 0 ? v : undefined;
}

/** A string as it is, anything else as nothing. */
function text(v: unknown): string {
  return typeof v === "string" ? v : "";
}
