/** A day's usage per agent and per user, as the agents reported it (`usage.get`; docs/flow-control.md#usage-and-budgets). */

import type { Usage, UsageReply } from "@boxcar/protocol";
import type { Api } from "../api.js";
import { Failure, html, useLive } from "../html.js";
import type { Route } from "../route.js";

export function UsageView({ api, route }: { api: Api; route: Route }) {
  const day = route.params.get("day") ?? "";
  // Usage is summed from events the dashboard does not follow: it asks again every few seconds.
  const live = useLive(api, () => api.request<UsageReply>("usage.get", day ? { day } : {}), {
    subjects: [],
    deps: [day],
    quietMs: 1000,
    everyMs: 5000,
  });
  const reply = live.value;
  const rows = (kind: string, of: Record<string, Usage>) =>
    Object.entries(of).map(
      ([name, u]) => html`<tr data-usage=${`${kind}:${name}`}>
        <td>${kind}</td><td>${name}</td><td>${u.calls}</td><td>${u.tokensIn}</td><td>${u.tokensOut}</td><td>${u.cost}</td>
      </tr>`,
    );
  const empty = reply && Object.keys(reply.agents).length + Object.keys(reply.users).length === 0;
  return html`
    <section>
      <h1>Usage${reply ? ` on ${reply.day} (UTC)` : ""}</h1>
      <${Failure} error=${live.error} />
      ${empty && html`<p class="empty">No usage reported that day.</p>`}
      ${
        reply &&
        !empty &&
        html`<table class="usage">
        <thead><tr><th>of</th><th>name</th><th>calls</th><th>tokens in</th><th>tokens out</th><th>cost</th></tr></thead>
        <tbody>${rows("agent", reply.agents)}${rows("user", reply.users)}</tbody>
      </table>`
      }
    </section>
  `;
}
