/**
 * Jobs, newest first, a page at a time from `jobs.list` (the dispatchers page through their job
 * index, so this stays quick at any number of jobs), filtered by state, agent and pool there,
 * and by owner and time of creation here; with the count in each state; both reload when a job
 * event arrives. Pages go both ways: the list API pages forward only, so the page keeps the
 * cursor of each page it came through, and goes back by it.
 */

import type { CountJobsReply, JobRecord, ListJobsReply, ListJobsRequest } from "@boxcar/protocol";
import { useState } from "preact/hooks";
import type { Api } from "../api.js";
import { At, Badge, Failure, html, jobEventsSubject, Took, useLive } from "../html.js";
import { hrefOf, navigate, type Route } from "../route.js";

export const JOB_STATES = ["queued", "running", "succeeded", "failed", "timed_out", "cancelled", "dead", "expired", "rejected"] as const;

const PAGE = 25;
/** With filters the list API lacks (owner, from), how many jobs a page looks through at most before it stops and offers the next. */
const MAX_SCAN = 1_000;
/** The filters of the jobs page, as its address names them. */
export const JOB_FILTERS = ["state", "agent", "pool", "owner", "from", "to"] as const;

/**
 * The cursor of the page before each page this tab came to, by filters and cursor: `jobs.list`
 * pages forward only, so going back is by the way the reader came.
 */
const earlier = new Map<string, string>();

export function JobsView({ api, route }: { api: Api; route: Route }) {
  const get = (name: string) => route.params.get(name) ?? "";
  const [state, agent, pool, owner, from, to] = JOB_FILTERS.map(get) as [string, string, string, string, string, string];
  const after = get("after");
  const filters = { state, agent, pool, owner, from, to };
  const filterKey = JSON.stringify(filters);
  const filter = (changes: Record<string, string>) => navigate("jobs", { ...Object.fromEntries(route.params), after: "", ...changes });
  const live = useLive(
    api,
    async () => {
      const [page, counts] = await Promise.all([
        listJobs(api, filters, after),
        api.request<CountJobsReply>("jobs.count", agent ? { agent } : {}),
      ]);
      return { page, counts, key: filterKey, after };
    },
    { subjects: [jobEventsSubject(api)], deps: [filterKey, after] },
  );
  const page = live.value?.page;
  const counts = live.value?.counts;
  // Kept by the filters and cursor the page was read with (the address may have moved on since).
  if (live.value && page?.next) earlier.set(`${live.value.key} ${page.next}`, live.value.after);
  const previous = after ? earlier.get(`${filterKey} ${after}`) : undefined;
  const at = (cursor: string) => hrefOf("jobs", { ...Object.fromEntries(route.params), after: cursor });
  const narrowed = owner !== "" || from !== "" || to !== "";
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
        ${api.session.role !== "submitter" && html`<${TextFilter} key=${`owner:${owner}`} name="owner" value=${owner} onSet=${(v: string) => filter({ owner: v })} />`}
        <${TimeFilter} key=${`from:${from}`} name="from" label="Created from" value=${from} onSet=${(v: string) => filter({ from: v })} />
        <${TimeFilter} key=${`to:${to}`} name="to" label="to" value=${to} onSet=${(v: string) => filter({ to: v })} />
        ${counts && !narrowed && html`<span class="total">${counts.total} ${counts.total === 1 ? "job" : "jobs"}${agent ? ` of ${agent}` : ""}</span>`}
      </form>
      <${Failure} error=${live.error} />
      ${page && html`<${JobTable} jobs=${page.jobs} />`}
      ${page?.scanned !== undefined && html`<p class="note" data-scanned>Looked through ${page.scanned} jobs for this page; the next page goes on from there.</p>`}
      <nav class="pages">
        ${after && html`<a data-first href=${at("")}>first page</a>`}
        ${previous !== undefined && html`<a data-previous href=${at(previous)}>previous page</a>`}
        ${page?.next && html`<a data-next href=${at(page.next)}>next page</a>`}
      </nav>
    </section>
  `;
}

interface JobsPage {
  readonly jobs: JobRecord[];
  readonly next?: string;
  /** Set when the page stopped after looking through `MAX_SCAN` jobs, short of a full page. */
  readonly scanned?: number;
}

/**
 * One page of jobs newest first. State, agent and pool are the list API's filters. `to` is a
 * cursor: job ids begin with their creation time (ms, 9 base-36 digits) and sort by it, so the
 * jobs created before `to` come after the id prefix of `to`. Owner and `from` are applied here,
 * page after page of the API's (until this page is full, the jobs are older than `from`, or
 * `MAX_SCAN` were looked through).
 */
async function listJobs(api: Api, f: Record<(typeof JOB_FILTERS)[number], string>, after: string): Promise<JobsPage> {
  const fromMs = f.from ? timeOf(f.from) : undefined;
  const toMs = f.to ? timeOf(f.to) : undefined;
  const base: ListJobsRequest = {
    ...(f.state && { state: f.state as JobRecord["state"] }),
    ...(f.agent && { agent: f.agent }),
    ...(f.pool && { pool: f.pool }),
  };
  let cursor = after || (toMs !== undefined ? idBefore(toMs) : "");
  const keep = (job: JobRecord) =>
    (!f.owner || (job.owner ?? "local") === f.owner) && (toMs === undefined || Date.parse(job.createdAt) < toMs);
  if (!f.owner && fromMs === undefined) {
    const page = await api.request<ListJobsReply>("jobs.list", { ...base, limit: PAGE, ...(cursor && { after: cursor }) });
    return { jobs: page.jobs.filter(keep), ...(page.next ? { next: page.next } : {}) };
  }
  const jobs: JobRecord[] = [];
  let scanned = 0;
  for (;;) {
    const page = await api.request<ListJobsReply>("jobs.list", { ...base, limit: f.owner ? 100 : PAGE, ...(cursor && { after: cursor }) });
    for (const [i, job] of page.jobs.entries()) {
      // Newest first: past `from`, every job after is older still.
      if (fromMs !== undefined && Date.parse(job.createdAt) < fromMs) return { jobs };
      if (!keep(job)) continue;
      if (jobs.length === PAGE) {
        // One more matches: there is a next page, after the last one shown.
        return { jobs, next: (jobs.at(-1) as JobRecord).id };
      }
      jobs.push(job);
      if (jobs.length === PAGE && i === page.jobs.length - 1 && page.next) return { jobs, next: job.id };
    }
    scanned += page.jobs.length;
    if (!page.next) return { jobs };
    cursor = page.next;
    if (scanned >= MAX_SCAN) return jobs.length === PAGE ? { jobs, next: (jobs.at(-1) as JobRecord).id } : { jobs, next: cursor, scanned };
  }
}

/** A time as the filters take it (`2026-11-25T21:31`, local, or any date `Date` reads); NaN is refused. */
function timeOf(text: string): number {
  const ms = new Date(text).getTime();
  if (Number.isNaN(ms)) throw new RangeError(`${text} is not a date and time (2026-11-25T21:31, say)`);
  return ms;
}

/** The smallest job id of a job created at `ms`: every id below it is of a job created before. */
function idBefore(ms: number): string {
  return Math.max(0, Math.floor(ms)).toString(36).padStart(9, "0");
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
              <td data-created><${At} iso=${job.createdAt} /></td>
              <td data-took-cell>${job.startedAt && html`<${Took} from=${job.startedAt} to=${job.finishedAt} live=${job.state === "running"} />`}</td>
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

/** A date and time filter (to the second, local time), applied when it changes. */
function TimeFilter({ name, label, value, onSet }: { name: string; label: string; value: string; onSet: (v: string) => void }) {
  return html`<label>${label}
    <input type="datetime-local" step="1" name=${name} value=${localInput(value)}
      onChange=${(e: Event) => onSet((e.target as HTMLInputElement).value)} />
  </label>`;
}

/** A filter's time as a `datetime-local` input shows it (`2026-11-25T21:31:02`, local); "" for none or a bad one. */
function localInput(text: string): string {
  if (!text) return "";
  const t = new Date(text);
  if (Number.isNaN(t.getTime())) return "";
  const two = (n: number) => String(n).padStart(2, "0");
  return `${t.getFullYear()}-${two(t.getMonth() + 1)}-${two(t.getDate())}T${two(t.getHours())}:${two(t.getMinutes())}:${two(t.getSeconds())}`;
}
