/**
 * The dashboard page: asks `boxcar ui` for a session (where NATS's WebSocket listener is, who the
 * page is, and a short-lived credential when the server authenticates), connects, and shows the
 * view the URL's fragment names. A one-time login token arrives in the fragment (`#t=…`), which
 * the browser never sends to a server; it is exchanged once, then dropped from the address bar.
 */

import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { Api, type SessionInfo } from "./api.js";
import { html } from "./html.js";
import { currentRoute, type Route } from "./route.js";
import { AgentsView } from "./views/agents.js";
import { DeadView } from "./views/dead.js";
import { JobView } from "./views/job.js";
import { JobsView } from "./views/jobs.js";
import { RunView } from "./views/run.js";
import { RunsView } from "./views/runs.js";
import { SearchBox } from "./views/search.js";
import { UsageView } from "./views/usage.js";
import { WorkersView } from "./views/workers.js";

async function askSession(token?: string): Promise<SessionInfo> {
  const res = await fetch("/session", {
    method: "POST",
    headers: token ? { authorization: `Bearer ${token}` } : {},
    credentials: "same-origin",
  });
  const body = (await res.json().catch(() => ({}))) as SessionInfo & { error?: string };
  if (!res.ok) throw new Error(body.error ?? `the dashboard refused a session (HTTP ${res.status})`);
  return body;
}

/** Asks for a new credential a while before the current one expires, for the next reconnection. */
function keepRenewing(api: Api, session: SessionInfo): void {
  if (!session.expiresAt) return;
  const inMs = Math.max(5_000, (session.expiresAt - Date.now()) / 2);
  setTimeout(async () => {
    try {
      const next = await askSession();
      if (next.creds) api.renew(next.creds);
      keepRenewing(api, next);
    } catch (err) {
      api.onTrouble(`could not renew the page's credential: ${(err as Error).message}`);
      setTimeout(() => keepRenewing(api, session), 5_000);
    }
  }, inMs);
}

const VIEWS: readonly [string, string][] = [
  ["jobs", "Jobs"],
  ["runs", "Workflow runs"],
  ["workers", "Workers"],
  ["agents", "Agents"],
  ["dead", "Dead letters"],
  ["usage", "Usage"],
];

function App({ api }: { api: Api }) {
  const [route, setRoute] = useState<Route>(currentRoute());
  useEffect(() => {
    const on = () => setRoute(currentRoute());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  const active = route.view === "job" ? "jobs" : route.view === "run" ? "runs" : route.view;
  return html`
    <header>
      <span class="brand">Boxcar</span>
      <nav>${VIEWS.map(([view, label]) => html`<a href=${`#/${view}`} class=${view === active ? "active" : ""}>${label}</a>`)}</nav>
      <${SearchBox} api=${api} />
      <span class="who" data-who>${api.session.role} ${api.session.user}</span>
    </header>
    <main>${view(api, route)}</main>
  `;
}

function view(api: Api, route: Route) {
  switch (route.view) {
    case "job":
      return html`<${JobView} key=${route.id} api=${api} id=${route.id ?? ""} />`;
    case "runs":
      return html`<${RunsView} api=${api} route=${route} />`;
    case "run":
      return html`<${RunView} key=${route.id} api=${api} id=${route.id ?? ""} />`;
    case "workers":
      return html`<${WorkersView} api=${api} />`;
    case "dead":
      return html`<${DeadView} api=${api} route=${route} />`;
    case "agents":
      return html`<${AgentsView} api=${api} />`;
    case "usage":
      return html`<${UsageView} api=${api} route=${route} />`;
    default:
      return html`<${JobsView} api=${api} route=${route} />`;
  }
}

async function start(root: HTMLElement): Promise<void> {
  const token = /^#t=([A-Za-z0-9_-]+)$/.exec(location.hash)?.[1];
  if (token) history.replaceState(null, "", `${location.pathname}#/jobs`);
  const session = await askSession(token);
  const api = await Api.connect(session).catch((err: Error) => {
    throw new Error(`could not connect to NATS at ${session.ws}: ${err.message || err.name}`);
  });
  keepRenewing(api, session);
  // Trouble shows in a banner of its own, above the views.
  const trouble = document.createElement("p");
  trouble.className = "error banner";
  trouble.setAttribute("role", "alert");
  trouble.hidden = true;
  root.before(trouble);
  api.onTrouble = (message) => {
    trouble.hidden = message === undefined;
    trouble.textContent = message ?? "";
  };
  void api.closed().then((err) => {
    document.body.dataset.connection = "closed";
    root.insertAdjacentHTML("afterbegin", '<p class="error banner" role="alert"></p>');
    (root.firstChild as HTMLElement).textContent = `disconnected from NATS${err ? `: ${err.message}` : ""}; reload to connect again`;
  });
  document.body.dataset.connection = "open";
  root.textContent = "";
  render(html`<${App} api=${api} />`, root);
}

const root = document.getElementById("app") as HTMLElement;
start(root).catch((err: Error) => {
  root.textContent = "";
  const p = document.createElement("p");
  p.className = "error banner";
  p.setAttribute("role", "alert");
  p.textContent = err.message;
  root.append(p);
});
