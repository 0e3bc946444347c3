/** Workflow runs, newest first, a page at a time from `workflows.list`, reloaded when a run's event arrives. */

import type { ListRunsReply } from "@boxcar/protocol";
import type { Api } from "../api.js";
import { Badge, duration, Failure, html, jobEventsSubject, useLive, when } from "../html.js";
import { hrefOf, navigate, type Route } from "../route.js";

const RUN_STATES = ["running", "succeeded", "failed", "cancelled"] as const;
const PAGE = 25;

export function RunsView({ api, route }: { api: Api; route: Route }) {
  const state = route.params.get("state") ?? "";
  const after = route.params.get("after") ?? "";
  const go = (changes: Record<string, string>) => navigate("runs", { ...Object.fromEntries(route.params), ...changes });
  const live = useLive(
    api,
    // `after: ""` asks for the first page with a cursor to the next.
    () => api.request<ListRunsReply>("workflows.list", { limit: PAGE, after, ...(state && { state }) }),
    { subjects: [jobEventsSubject(api, "workflow")], deps: [state, after] },
  );
  const runs = live.value?.runs ?? [];
  return html`
    <section>
      <h1>Workflow runs</h1>
      <form class="filters" onSubmit=${(e: Event) => e.preventDefault()}>
        <label>State
          <select name="state" value=${state} onChange=${(e: Event) => go({ state: (e.target as HTMLSelectElement).value, after: "" })}>
            <option value="">any</option>
            ${RUN_STATES.map((s) => html`<option value=${s}>${s}</option>`)}
          </select>
        </label>
      </form>
      <${Failure} error=${live.error} />
      ${live.value && runs.length === 0 && html`<p class="empty">No workflow runs.</p>`}
      ${
        runs.length > 0 &&
        html`<table class="runs">
        <thead><tr><th>run</th><th>workflow</th><th>state</th><th>owner</th><th>steps</th><th>created</th><th>took</th></tr></thead>
        <tbody>
          ${runs.map((run) => {
            const steps = Object.values(run.steps);
            const done = steps.filter((s) => s.state === "succeeded" || s.state === "skipped").length;
            return html`<tr data-run=${run.id}>
              <td><a href=${`#/run/${run.id}`}>${run.id}</a></td>
              <td>${run.workflow.name}</td>
              <td><${Badge} state=${run.state} /></td>
              <td>${run.owner ?? "local"}</td>
              <td>${done}/${steps.length}</td>
              <td>${when(run.createdAt)}</td>
              <td>${duration(run.createdAt, run.finishedAt)}</td>
            </tr>`;
          })}
        </tbody>
      </table>`
      }
      <nav class="pages">
        ${after && html`<a href=${hrefOf("runs", { state })}>first page</a>`}
        ${live.value?.next && html`<a data-next href=${hrefOf("runs", { state, after: live.value.next })}>next page</a>`}
      </nav>
    </section>
  `;
}
