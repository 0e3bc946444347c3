/** Workflow runs, newest first, a page at a time from `workflows.list`, reloaded when a run's event arrives. */

import type { ListRunsReply } from "@boxcar/protocol";
import type { Api } from "../api.js";
import { At, Badge, Failure, html, jobEventsSubject, Took, useLive } from "../html.js";
import { hrefOf, navigate, type Route } from "../route.js";

const RUN_STATES = ["running", "succeeded", "failed", "cancelled"] as const;
const PAGE = 25;

export function RunsView({ api, route }: { api: Api; route: Route }) {
  const state = route.params.get("state") ?? "";
  // Only the runs an approval step of which waits for this page's principal (docs/workflows.md#approvals).
  const awaiting = route.params.get("awaiting") === "1" ? "1" : "";
  const after = route.params.get("after") ?? "";
  const go = (changes: Record<string, string>) => navigate("runs", { ...Object.fromEntries(route.params), ...changes });
  const live = useLive(
    api,
    // `after: ""` asks for the first page with a cursor to the next.
    () =>
      api.request<ListRunsReply>("workflows.list", { limit: PAGE, after, ...(state && { state }), ...(awaiting && { awaiting: true }) }),
    // Runs awaiting a decision may be other users' (whose events this page may not follow): read every 3 s too.
    { subjects: [jobEventsSubject(api, "workflow")], deps: [state, awaiting, after], ...(awaiting && { everyMs: 3_000 }) },
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
        <label><input type="checkbox" name="awaiting" checked=${awaiting === "1"}
          onChange=${(e: Event) => go({ awaiting: (e.target as HTMLInputElement).checked ? "1" : "", after: "" })} /> awaiting my decision</label>
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
              <td data-created><${At} iso=${run.createdAt} /></td>
              <td><${Took} from=${run.createdAt} to=${run.finishedAt} live=${run.state === "running"} /></td>
            </tr>`;
          })}
        </tbody>
      </table>`
      }
      <nav class="pages">
        ${after && html`<a href=${hrefOf("runs", { state, awaiting })}>first page</a>`}
        ${live.value?.next && html`<a data-next href=${hrefOf("runs", { state, awaiting, after: live.value.next })}>next page</a>`}
      </nav>
    </section>
  `;
}
