/**
 * Jobs, newest first, a page at a time from `jobs.list` (the dispatchers page through their job
 * index, so this stays quick at any number of jobs), filtered by state, agent and pool, with the
 * count in each state; both reload when a job event arrives.
 */

import type { CountJobsReply, JobRecord, ListJobsReply } from "@boxcar/protocol";
import { useState } from "preact/hooks";
import type { Api } from "../api.js";
import { Badge, duration, Failure, html, jobEventsSubject, useLive, when } from "../html.js";
import { hrefOf, navigate, type Route } from "../route.js";

export const JOB_STATES = ["queued", "running", "succeeded", "failed", "timed_out", "cancelled", "dead", "expired", "rejected"] as const;

const PAGE = 25;

export function JobsView({ api, route }: { api: Api; route: Route }) {
  const state = route.params.get("state") ?? "";
  const agent = route.params.get("agent") ?? "";
  const pool = route.params.get("pool") ?? "";
  const after = route.params.get("after") ?? "";
  const filter = (changes: Record<string, string>) => navigate("jobs", { ...Object.fromEntries(route.params), after: "", ...changes });
  const live = useLive(
    api,
    async () => {
      const request = { limit: PAGE, ...(state && { state }), ...(agent && { agent }), ...(pool && { pool }), ...(after && { after }) };
      const [page, counts] = await Promise.all([
        api.request<ListJobsReply>("jobs.list", request),
        api.request<CountJobsReply>("jobs.count", agent ? { agent } : {}),
      ]);
      return { page, counts };
    },
    { subjects: [jobEventsSubject(api)], deps: [state, agent, pool, after] },
  );
  const page = live.value?.page;
  const counts = live.value?.counts;
  return html`
    <section>
      <h1>Jobs</h1>
      <form class="filters" onSubmit=${(e: Event) => e.preventDefault()}>
        <label>State
          <select name="state" value=${state} onChange=${(e: Event) => filter({ state: (e.target as HTMLSelectElement).value })}>
            <option value="">any</option>
            ${JOB_STATES.map((s) => html`<option value=${s}>${s}${counts ? ` (${counts.counts[s] ?? 0})` : ""}</option>`)}
          </select>
        </label>
        <${TextFilter} key=${`agent:${agent}`} name="agent" value=${agent} onSet=${(v: string) => filter({ agent: v })} />
        <${TextFilter} key=${`pool:${pool}`} name="pool" value=${pool} onSet=${(v: string) => filter({ pool: v })} />
        ${counts && html`<span class="total">${counts.total} ${counts.total === 1 ? "job" : "jobs"}${agent ? ` of ${agent}` : ""}</span>`}
      </form>
      <${Failure} error=${live.error} />
      ${page && html`<${JobTable} jobs=${page.jobs} />`}
      <nav class="pages">
        ${after && html`<a href=${hrefOf("jobs", { ...Object.fromEntries(route.params), after: "" })}>first page</a>`}
        ${page?.next && html`<a data-next href=${hrefOf("jobs", { ...Object.fromEntries(route.params), after: page.next })}>next page</a>`}
      </nav>
    </section>
  `;
}

export function JobTable({ jobs, select }: { jobs: JobRecord[]; select?: { chosen: Set<string>; toggle: (id: string) => void } }) {
  if (jobs.length === 0) return html`<p class="empty">No jobs.</p>`;
  return html`
    <table class="jobs">
      <thead><tr>${select && html`<th></th>`}<th>job</th><th>agent</th><th>pool</th><th>state</th><th>owner</th><th>created</th><th>took</th><th>summary</th></tr></thead>
      <tbody>
        ${jobs.map(
          (job) => html`
            <tr data-job=${job.id}>
              ${select && html`<td><input type="checkbox" aria-label=${`select ${job.id}`} checked=${select.chosen.has(job.id)} onChange=${() => select.toggle(job.id)} /></td>`}
              <td><a href=${`#/job/${job.id}`}>${job.id}</a></td>
              <td>${job.agent}</td>
              <td>${job.pool}</td>
              <td><${Badge} state=${job.state} /></td>
              <td>${job.owner ?? "local"}</td>
              <td>${when(job.createdAt)}</td>
              <td>${job.startedAt ? duration(job.startedAt, job.finishedAt) : ""}</td>
              <td class="summary">${job.error?.message ?? job.result?.summary ?? ""}</td>
            </tr>`,
        )}
      </tbody>
    </table>
  `;
}

/** A text filter applied on Enter or when it loses focus. */
function TextFilter({ name, value, onSet }: { name: string; value: string; onSet: (v: string) => void }) {
  const [text, setText] = useState(value);
  const apply = () => text.trim() !== value && onSet(text.trim());
  return html`<label>${name[0]?.toUpperCase()}${name.slice(1)}
    <input name=${name} value=${text} placeholder="any" onInput=${(e: Event) => setText((e.target as HTMLInputElement).value)}
      onKeyDown=${(e: KeyboardEvent) => e.key === "Enter" && apply()} onBlur=${apply} />
  </label>`;
}
