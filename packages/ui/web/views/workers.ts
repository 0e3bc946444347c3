/** Workers from their presence (`workers.list`): state, load, sandboxes, warm containers and the jobs they run. */

import type { WorkerInfo } from "@boxcar/protocol";
import { workerStatus } from "@boxcar/protocol/worker-status";
import type { Api } from "../api.js";
import { Badge, Failure, html, useLive, when } from "../html.js";

export function WorkersView({ api }: { api: Api }) {
  // Submitters may not follow worker events; and a worker goes quiet when it is gone, so every
  // page also asks again every few seconds.
  const subjects = api.session.role === "submitter" ? [] : [`${api.names.prefix}.evt.worker.>`];
  const live = useLive(api, () => api.request<{ workers: WorkerInfo[] }>("workers.list"), {
    subjects,
    deps: [],
    quietMs: 1000,
    everyMs: 3000,
  });
  const workers = live.value?.workers ?? [];
  return html`
    <section>
      <h1>Workers</h1>
      <${Failure} error=${live.error} />
      ${live.value && workers.length === 0 && html`<p class="empty">No workers.</p>`}
      ${
        workers.length > 0 &&
        html`<table class="workers">
        <thead><tr><th>worker</th><th>state</th><th>host</th><th>pools</th><th>sandboxes</th><th>load</th><th>warm</th><th>heartbeat</th><th>jobs</th></tr></thead>
        <tbody>
          ${workers.map(
            (w) => html`<tr data-worker=${w.id}>
              <td>${w.id}</td>
              <td><${Badge} state=${workerStatus(w)} /></td>
              <td>${w.host} (pid ${w.pid})</td>
              <td>${w.pools.join(", ")}</td>
              <td>${w.sandboxes.join(", ")}</td>
              <td><meter min="0" max=${w.capacity} value=${w.load}></meter> ${w.load}/${w.capacity}</td>
              <td>${w.warm ?? ""}</td>
              <td>${when(w.heartbeatAt)}</td>
              <td>${w.jobs.map((id) => html`<a href=${`#/job/${id}`}>${id}</a> `)}</td>
            </tr>`,
          )}
        </tbody>
      </table>`
      }
    </section>
  `;
}
