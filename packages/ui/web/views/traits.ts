/**
 * What a job's and a run's pages both show: labels, the trace id (linked to the tracing UI the
 * dashboard was given, `boxcar ui --trace-url`), and files the page makes for the browser to save.
 */

import type { Api } from "../api.js";
import { html } from "../html.js";

/** Labels as `key=value` chips, in key order. */
export function Labels({ labels }: { labels: Readonly<Record<string, string>> }) {
  return html`<span class="labels" data-labels>${Object.entries(labels)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => html`<span class="tag" data-label=${k}>${k}=${v}</span> `)}</span>`;
}

/** The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`), if it is one. */
export function traceIdOf(traceparent: string | undefined): string | undefined {
  return /^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$/.exec(traceparent ?? "")?.[1];
}

/** Where the tracing UI shows a trace: the template with `{traceId}` filled in; only an http(s) address. */
export function traceHref(template: string | undefined, traceId: string): string | undefined {
  if (!template?.includes("{traceId}")) return undefined;
  try {
    const url = new URL(template.replaceAll("{traceId}", traceId));
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : undefined;
  } catch {
    return undefined;
  }
}

/** A trace id, linked to the tracing UI (in a new tab) when the dashboard knows one. */
export function TraceId({ api, traceparent }: { api: Api; traceparent: string }) {
  const id = traceIdOf(traceparent);
  if (!id) return null;
  const href = traceHref(api.session.traceUrl, id);
  return href
    ? html`<a class="trace" data-trace=${id} href=${href} target="_blank" rel="noopener noreferrer"><code>${id}</code></a>`
    : html`<code class="trace" data-trace=${id} title="no tracing UI is set: boxcar ui --trace-url">${id}</code>`;
}

/** Has the browser save `data` as a file named `name`: made here, never opened in the page. */
export function saveFile(name: string, data: Blob | string, type: string): void {
  const url = URL.createObjectURL(new Blob([data], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.rel = "noopener";
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
