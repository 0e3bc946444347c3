/** The applied agents (`agents.list`): where their jobs run and how, to read before submitting. */

import type { AgentDefinition } from "@boxcar/protocol";
import type { Api } from "../api.js";
import { Failure, html, useLive } from "../html.js";
import { hrefOf } from "../route.js";

export function AgentsView({ api }: { api: Api }) {
  // Agents change rarely and say so on no subject a viewer follows: read on opening the page.
  const live = useLive(api, () => api.request<{ agents: AgentDefinition[] }>("agents.list"), { subjects: [], deps: [] });
  const agents = live.value?.agents ?? [];
  return html`
    <section>
      <h1>Agents</h1>
      <${Failure} error=${live.error} />
      ${live.value && agents.length === 0 && html`<p class="empty">No agents applied: <code>boxcar agent apply -f FILE</code>.</p>`}
      ${
        agents.length > 0 &&
        html`<table class="agents">
        <thead><tr><th>agent</th><th>description</th><th>pool</th><th>sandbox</th><th>network</th><th>timeout</th><th>retries</th><th>hands off to</th><th>jobs</th></tr></thead>
        <tbody>
          ${agents.map(
            (a) => html`<tr data-agent=${a.name}>
              <td>${a.name}${a.trusted ? html` <span class="note">trusted</span>` : ""}</td>
              <td class="summary">${a.description ?? ""}</td>
              <td>${a.pool}</td>
              <td>${a.runtime.sandbox}${a.runtime.image ? ` (${a.runtime.image})` : ""}</td>
              <td>${a.runtime.network}</td>
              <td>${Math.round(a.runtime.timeout / 1000)} s</td>
              <td>${a.retry ? `up to ${a.retry.maxAttempts} attempts` : "none"}</td>
              <td>${a.handoffs.join(", ")}</td>
              <td><a href=${hrefOf("jobs", { agent: a.name })}>jobs</a></td>
            </tr>`,
          )}
        </tbody>
      </table>`
      }
    </section>
  `;
}
