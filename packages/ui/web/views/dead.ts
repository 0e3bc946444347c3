/**
 * Dead letters: jobs that ran out of attempts, a page at a time, to retry one by one or all
 * those chosen at once (`jobs.retry` each; the dispatcher checks each against the caller).
 */

import type { JobRecord, ListJobsReply } from "@boxcar/protocol";
import { useEffect, useState } from "preact/hooks";
import { type Api, ApiError } from "../api.js";
import { Failure, html, jobEventsSubject, useLive } from "../html.js";
import { hrefOf, type Route } from "../route.js";
import { JobTable } from "./jobs.js";

const PAGE = 50;

export function DeadView({ api, route }: { api: Api; route: Route }) {
  const after = route.params.get("after") ?? "";
  const [chosen, setChosen] = useState<Set<string>>(new Set());
  // A selection is of the page it was made on.
  useEffect(() => setChosen(new Set()), [after]);
  const [outcome, setOutcome] = useState<string[]>([]);
  const live = useLive(api, () => api.request<ListJobsReply>("jobs.list", { state: "dead", limit: PAGE, ...(after && { after }) }), {
    subjects: [jobEventsSubject(api)],
    deps: [after],
  });
  const jobs = live.value?.jobs ?? [];
  const retryable = jobs.filter((j) => api.mayAct(j.owner));
  const toggle = (id: string) =>
    setChosen((now) => {
      const next = new Set(now);
      next.has(id) ? next.delete(id) : next.add(id);
      return next;
    });
  const retry = async () => {
    const ids = [...chosen];
    const lines: string[] = [];
    for (const id of ids) {
      try {
        const { job } = await api.request<{ job: JobRecord }>("jobs.retry", { id });
        lines.push(`${id}: ${job.state}`);
      } catch (err) {
        lines.push(`${id}: ${err instanceof ApiError ? `${err.code}: ` : ""}${(err as Error).message}`);
      }
    }
    setOutcome(lines);
    setChosen(new Set());
    live.reload();
  };
  return html`
    <section>
      <h1>Dead letters</h1>
      <p class="hint">Jobs that used every attempt. A retry queues one again with a fresh budget of attempts.</p>
      <${Failure} error=${live.error} />
      ${
        retryable.length > 0 &&
        html`<div class="actions">
        <button onClick=${() => setChosen(new Set(retryable.map((j) => j.id)))}>Select all on this page</button>
        <button data-action="retry-selected" disabled=${chosen.size === 0} onClick=${retry}>Retry ${chosen.size} selected</button>
      </div>`
      }
      ${outcome.length > 0 && html`<ul class="outcome" data-outcome>${outcome.map((l) => html`<li>${l}</li>`)}</ul>`}
      ${live.value && html`<${JobTable} jobs=${jobs} select=${retryable.length > 0 ? { chosen, toggle } : undefined} />`}
      <nav class="pages">
        ${after && html`<a href=${hrefOf("dead")}>first page</a>`}
        ${live.value?.next && html`<a data-next href=${hrefOf("dead", { after: live.value.next })}>next page</a>`}
      </nav>
    </section>
  `;
}
