/**
 * A job's calls through its worker's model gateway (docs/models.md#metering), as a table: one
 * row per `model_call` event, in the order of the job's events, and their totals. The events
 * reach the page unchecked, so each field is read as what it should be (a number or a string,
 * else nothing) and shown as text.
 */

import type { BoxcarEvent } from "@boxcar/protocol";
import { html } from "../html.js";

/** One call as the table shows it. */
interface CallRow {
  readonly attempt: number;
  readonly provider: string;
  readonly model: string;
  readonly status: number | undefined;
  readonly stream: boolean;
  readonly replayed: boolean;
  /** Why the gateway answered it itself, the provider not called (`budget`, `limit`); empty when it did not. */
  readonly refused: string;
  readonly latencyMs: number | undefined;
  readonly firstByteMs: number | undefined;
  readonly tokensIn: number;
  readonly tokensOut: number;
  readonly cacheReadTokens: number | undefined;
  readonly cacheWriteTokens: number | undefined;
  readonly cost: number | undefined;
}

/** The job's model calls, from its events (folded ones already unfolded), oldest first. */
export function modelCalls(events: readonly BoxcarEvent[]): CallRow[] {
  return events.flatMap((e) => {
    if (e.kind !== "job" || e.type !== "model_call" || typeof e.call !== "object" || e.call === null) return [];
    const call = e.call as Record<string, unknown>;
    return [
      {
        attempt: count(e.attempt) ?? 0,
        provider: text(call.provider),
        model: text(call.model),
        status: count(call.status),
        stream: call.stream === true,
        replayed: call.replayed === true,
        refused: text(call.refused),
        latencyMs: amount(call.latencyMs),
        firstByteMs: amount(call.firstByteMs),
        tokensIn: count(call.tokensIn) ?? 0,
        tokensOut: count(call.tokensOut) ?? 0,
        cacheReadTokens: count(call.cacheReadTokens),
        cacheWriteTokens: count(call.cacheWriteTokens),
        cost: amount(call.cost),
      },
    ];
  });
}

/** The table of a job's model calls, with a totals row; nothing when it made none. */
export function ModelCalls({ events }: { events: readonly BoxcarEvent[] }) {
  const calls = modelCalls(events);
  if (calls.length === 0) return null;
  // A cost column only when the system prices some call (a call with no price carries none).
  const priced = calls.some((c) => c.cost !== undefined);
  const total = {
    tokensIn: calls.reduce((n, c) => n + c.tokensIn, 0),
    tokensOut: calls.reduce((n, c) => n + c.tokensOut, 0),
    cost: calls.reduce((n, c) => n + (c.cost ?? 0), 0),
  };
  return html`
    <h2>Model calls</h2>
    <table class="model-calls" data-model-calls>
      <thead>
        <tr>
          <th class="num">attempt</th><th>provider</th><th>model</th><th class="num">status</th>
          <th class="num">tokens in</th><th class="num">tokens out</th>${priced && html`<th class="num">cost</th>`}
          <th class="num">ms</th><th>streamed</th><th>replayed</th>
        </tr>
      </thead>
      <tbody>
        ${calls.map(
          (c, i) => html`<tr data-model-call=${i + 1}>
            <td class="num">${c.attempt}</td>
            <td>${c.provider}</td>
            <td>${c.model}</td>
            <td class=${c.status !== undefined && c.status >= 400 ? "num error" : "num"}>${c.status ?? ""}${c.refused && ` refused (${c.refused})`}</td>
            <td class="num" title=${cacheNote(c)}>${c.tokensIn}</td>
            <td class="num">${c.tokensOut}</td>
            ${priced && html`<td class="num">${c.cost === undefined ? "" : money(c.cost)}</td>`}
            <td class="num" title=${c.firstByteMs === undefined ? undefined : `first byte after ${Math.round(c.firstByteMs)} ms`}>${c.latencyMs === undefined ? "" : Math.round(c.latencyMs)}</td>
            <td>${c.stream ? "yes" : "no"}</td>
            <td>${c.replayed ? "yes" : "no"}</td>
          </tr>`,
        )}
      </tbody>
      <tfoot>
        <tr data-model-calls-total>
          <td colspan="4">${calls.length} ${calls.length === 1 ? "call" : "calls"}</td>
          <td class="num">${total.tokensIn}</td>
          <td class="num">${total.tokensOut}</td>
          ${priced && html`<td class="num">${money(total.cost)}</td>`}
          <td colspan="3"></td>
        </tr>
      </tfoot>
    </table>
  `;
}

/** The cache tokens counted in a call's tokens in, as a tooltip; undefined when the provider reported none. */
function cacheNote(c: CallRow): string | undefined {
  const parts = [
    c.cacheReadTokens ? `${c.cacheReadTokens} read from the provider's cache` : "",
    c.cacheWriteTokens ? `${c.cacheWriteTokens} written to it` : "",
  ].filter(Boolean);
  return parts.length > 0 ? `of which ${parts.join(", ")}` : undefined;
}

/** A cost to 4 significant digits, never in exponent form: `0.0001464`, `0.5`, `1234.5`. */
export function money(n: number): string {
  if (n === 0) return "0";
  const decimals = Math.min(12, Math.max(2, 3 - Math.floor(Math.log10(Math.abs(n)))));
  return n
    .toFixed(decimals)
    .replace(/(\.\d*?)0+$/, "$1")
    .replace(/\.$/, "");
}

/** A whole number of at least 0, else undefined. */
function count(v: unknown): number | undefined {
  return typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : undefined;
}

/** A finite number of at least 0, else undefined. */
function amount(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) && v >= 0 ? v : undefined;
}

/** A string as it is, a number as its digits, anything else as nothing. */
function text(v: unknown): string {
  return typeof v === "string" ? v : typeof v === "number" && Number.isFinite(v) ? String(v) : "";
}
