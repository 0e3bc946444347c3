/**
 * The search box in the page's header: a job's or a run's id opens its page (`jobs.get`, then
 * `workflows.get`: what the page's principal may see), and filters (`agent:hello state:failed
 * owner:alice from:2026-11-25T09:00 to:…`) open the jobs list filtered so.
 */

import { useState } from "preact/hooks";
import { type Api, ApiError } from "../api.js";
import { html } from "../html.js";
import { navigate } from "../route.js";
import { JOB_FILTERS, JOB_STATES } from "./jobs.js";

const ID = /^[A-Za-z0-9_-]{1,64}$/;

/** What a search asks for: a page to open, or why it cannot be. */
export async function resolveSearch(api: Api, query: string): Promise<{ view: string; id?: string; params?: Record<string, string> }> {
  const words = query.trim().split(/\s+/).filter(Boolean);
  if (words.length === 0) throw new Error("type a job or run id, or filters such as agent:hello state:failed");
  if (words.some((w) => w.includes(":"))) {
    const params: Record<string, string> = {};
    for (const word of words) {
      const colon = word.indexOf(":");
      const [key, value] = colon < 0 ? ["", word] : [word.slice(0, colon).toLowerCase(), word.slice(colon + 1)];
      if (!(JOB_FILTERS as readonly string[]).includes(key)) {
        throw new Error(`${word}: filters are ${JOB_FILTERS.map((f) => `${f}:…`).join(", ")}; an id goes alone`);
      }
      if (key === "state" && !(JOB_STATES as readonly string[]).includes(value)) {
        throw new Error(`state:${value}: a state is one of ${JOB_STATES.join(", ")}`);
      }
      if ((key === "from" || key === "to") && Number.isNaN(new Date(value).getTime())) {
        throw new Error(`${word}: not a date and time (2026-11-25T09:00, say)`);
      }
      params[key] = value;
    }
    return { view: "jobs", params };
  }
  const [id] = words as [string];
  if (words.length > 1 || !ID.test(id)) throw new Error(`${query.trim()}: not a job or run id (filters are written key:value)`);
  // Run ids begin with `wf-`: ask for a run first, then a job; else the other way round.
  const asks: (["job", "jobs.get"] | ["run", "workflows.get"])[] = id.startsWith("wf-")
    ? [
        ["run", "workflows.get"],
        ["job", "jobs.get"],
      ]
    : [
        ["job", "jobs.get"],
        ["run", "workflows.get"],
      ];
  for (const [view, endpoint] of asks) {
    try {
      await api.request(endpoint, { id });
      return { view, id };
    } catch (err) {
      if (!(err instanceof ApiError && err.code === "not_found")) throw err;
    }
  }
  throw new Error(`no job or run ${id}`);
}

export function SearchBox({ api }: { api: Api }) {
  const [text, setText] = useState("");
  const [error, setError] = useState("");
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setError("");
    setBusy(true);
    try {
      const found = await resolveSearch(api, text);
      if (found.id !== undefined) location.hash = `#/${found.view}/${encodeURIComponent(found.id)}`;
      else navigate(found.view, found.params);
      setText("");
    } catch (err) {
      setError((err as Error).message);
    } finally {
      setBusy(false);
    }
  };
  return html`<form class="search" role="search" data-search onSubmit=${submit}>
    <input type="search" name="q" aria-label="search" placeholder="job or run id, or agent:… state:… owner:… from:… to:…" value=${text}
      disabled=${busy} onInput=${(e: Event) => setText((e.target as HTMLInputElement).value)} />
    ${error && html`<span class="search-error" role="alert" data-search-error>${error}</span>`}
  </form>`;
}
