/**
 * One workflow run drawn as its graph of steps: a column per depth of `needs`, an arrow from each
 * needed step, each step coloured by its state and followed live on the run's events; below, each
 * step's jobs; the approval steps, with Approve and Reject for those who may decide. Cancel where
 * the page's principal may.
 */

import type { WorkflowRun, WorkflowStep } from "@boxcar/protocol";
import { useState } from "preact/hooks";
import type { Api } from "../api.js";
import { At, Badge, Failure, html, Took, useLive, when } from "../html.js";
import { StepTimeline } from "./timeline.js";
import { Labels, TraceId } from "./traits.js";

const NODE_W = 170;
const NODE_H = 46;
const GAP_X = 70;
const GAP_Y = 24;

export function RunView({ api, id }: { api: Api; id: string }) {
  const [owner, setOwner] = useState<string | undefined>(undefined);
  const [actionError, setActionError] = useState<Error | undefined>(undefined);
  const live = useLive(
    api,
    async () => {
      const { run } = await api.request<{ run: WorkflowRun }>("workflows.get", { id });
      setOwner(run.owner ?? "local");
      return run;
    },
    // The owner is known after the first read; then the run's own events drive the page (an
    // approver who is not its owner may not follow them: the page reads the run every 3 s).
    owner === undefined || api.mayFollow(owner)
      ? { subjects: owner ? [api.names.subjects.runEvents(owner, id)] : [], deps: [id, owner] }
      : { subjects: [], everyMs: 3_000, deps: [id, owner] },
  );
  const run = live.value;
  if (!run) return html`<section><h1>Run ${id}</h1><${Failure} error=${live.error} /></section>`;
  const cancel = async () => {
    setActionError(undefined);
    try {
      await api.request("workflows.cancel", { id });
      live.reload();
    } catch (err) {
      setActionError(err as Error);
    }
  };
  return html`
    <section class="run">
      <h1>Run <code>${run.id}</code> <${Badge} state=${run.state} /></h1>
      <div class="actions">
        ${api.mayAct(run.owner) && run.state === "running" && html`<button data-action="cancel-run" onClick=${cancel}>Cancel run</button>`}
      </div>
      <${Failure} error=${actionError ?? live.error} />
      <dl class="facts">
        <dt>workflow</dt><dd>${run.workflow.name}</dd>
        <dt>owner</dt><dd>${run.owner ?? "local"}</dd>
        <dt>created</dt><dd><${At} iso=${run.createdAt} /></dd>
        <dt>took</dt><dd data-run-took><${Took} from=${run.createdAt} to=${run.finishedAt} live=${run.state === "running"} /></dd>
        ${Object.keys(run.labels ?? {}).length > 0 && html`<dt>labels</dt><dd><${Labels} labels=${run.labels} /></dd>`}
        ${run.traceparent && html`<dt>trace</dt><dd><${TraceId} api=${api} traceparent=${run.traceparent} /></dd>`}
      </dl>
      ${run.error && html`<p class="error">${run.error.code}: ${run.error.message}</p>`}
      <${Graph} run=${run} />
      <${StepTimeline} run=${run} />
      <h2>Steps</h2>
      <table class="steps">
        <thead><tr><th>step</th><th>agent</th><th>state</th><th>jobs</th><th>note</th></tr></thead>
        <tbody>
          ${run.workflow.steps.map((step) => {
            const s = run.steps[step.name];
            return html`<tr data-step=${step.name}>
              <td>${step.name}</td>
              <td>${step.agent ?? "approval"}</td>
              <td><${Badge} state=${s?.state ?? "pending"} /></td>
              <td>${(s?.instances ?? []).flatMap((i) => i.jobs).map((j) => html`<a href=${`#/job/${j}`}>${j}</a> `)}</td>
              <td>${s?.reason ?? ""}</td>
            </tr>`;
          })}
        </tbody>
      </table>
      <${Approvals} api=${api} run=${run} onDecided=${live.reload} />
      ${run.output !== undefined && html`<h2>Output</h2><pre class="result">${JSON.stringify(run.output, null, 2)}</pre>`}
    </section>
  `;
}

/**
 * The run's approval steps that were asked: what is asked of whom until when, and the decision
 * once given; while one waits, Approve and Reject (with a comment) for those who may decide. The
 * dispatcher checks the decision again.
 */
function Approvals({ api, run, onDecided }: { api: Api; run: WorkflowRun; onDecided: () => void }) {
  const [comments, setComments] = useState<Record<string, string>>({});
  const [error, setError] = useState<Error | undefined>(undefined);
  /** The step whose decision is being sent: its buttons wait. */
  const [sending, setSending] = useState<string | undefined>(undefined);
  const asked = run.workflow.steps.filter((step) => step.approval && run.steps[step.name]?.approval);
  if (asked.length === 0) return null;
  const decide = async (step: string, decision: "approve" | "reject") => {
    setError(undefined);
    setSending(step);
    const comment = comments[step]?.trim();
    try {
      await api.request("workflows.approve", { id: run.id, step, decision, ...(comment ? { comment } : {}) });
      onDecided();
    } catch (err) {
      setError(err as Error);
    } finally {
      setSending(undefined);
    }
  };
  return html`
    <h2>Approvals</h2>
    <${Failure} error=${error} />
    ${asked.map((step) => {
      const wanted = step.approval as NonNullable<WorkflowStep["approval"]>;
      const state = run.steps[step.name];
      const approval = state?.approval as NonNullable<NonNullable<typeof state>["approval"]>;
      const who = wanted.approvers.length > 0 ? wanted.approvers.join(", ") : `${run.owner ?? "local"} (the run's owner)`;
      // Past its deadline it waits only for the dispatcher to say it timed out: nothing to press.
      const waits = state?.state === "running" && approval.decision === undefined && Date.parse(approval.deadline) > Date.now();
      return html`<div class="approval" data-approval=${step.name} data-decision=${approval.decision ?? (waits ? "waiting" : "none")}>
        <p><strong>${step.name}</strong>${wanted.message ? html`: ${wanted.message}` : ""}</p>
        <p class="detail">asked of ${who} at ${when(approval.requestedAt)}; ${waits ? "waits until" : "deadline"} ${when(approval.deadline)}</p>
        ${
          approval.decision
            ? html`<p class="detail">${approval.decision} by ${approval.by} ${when(approval.at)}${approval.comment ? html`: “${approval.comment}”` : ""}</p>`
            : !waits && html`<p class="detail">${state?.reason ?? "not decided"}</p>`
        }
        ${
          waits &&
          api.mayDecide(wanted.approvers, run.owner) &&
          html`<div class="actions">
            <input data-comment placeholder="comment (optional)" maxlength="4096" value=${comments[step.name] ?? ""}
              onInput=${(e: Event) => setComments({ ...comments, [step.name]: (e.target as HTMLInputElement).value })} />
            <button data-action="approve" disabled=${sending !== undefined} onClick=${() => decide(step.name, "approve")}>Approve</button>
            <button data-action="reject" disabled=${sending !== undefined} onClick=${() => decide(step.name, "reject")}>Reject</button>
          </div>`
        }
      </div>`;
    })}
  `;
}

/** The steps as an SVG graph: x by depth in `needs`, y by order within that depth. */
function Graph({ run }: { run: WorkflowRun }) {
  const place = layout(run.workflow.steps);
  const width = Math.max(...[...place.values()].map((p) => p.x)) + NODE_W + 2;
  const height = Math.max(...[...place.values()].map((p) => p.y)) + NODE_H + 2;
  return html`
    <svg class="dag" data-dag width=${width} height=${height} viewBox=${`0 0 ${width} ${height}`} role="img" aria-label="steps of the run">
      <defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" /></marker></defs>
      ${run.workflow.steps.flatMap((step) =>
        step.needs.map((need) => {
          const from = place.get(need);
          const to = place.get(step.name);
          if (!from || !to) return null;
          const [x1, y1, x2, y2] = [from.x + NODE_W, from.y + NODE_H / 2, to.x, to.y + NODE_H / 2];
          const mid = (x1 + x2) / 2;
          return html`<path class="edge" d=${`M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`} marker-end="url(#arrow)" />`;
        }),
      )}
      ${run.workflow.steps.map((step) => {
        const p = place.get(step.name) ?? { x: 0, y: 0 };
        const s = run.steps[step.name];
        const state = s?.state ?? "pending";
        const jobs = (s?.instances ?? []).length;
        return html`<g class=${`node state-${state}`} data-node=${step.name} data-state=${state} transform=${`translate(${p.x + 1} ${p.y + 1})`}>
          <rect width=${NODE_W} height=${NODE_H} rx="6" />
          <text x="10" y="19" class="name">${step.name}</text>
          <text x="10" y="36" class="detail">${state}${jobs > 1 ? ` · ${jobs} jobs` : ""} · ${step.agent ?? "approval"}</text>
        </g>`;
      })}
    </svg>
  `;
}

function layout(steps: readonly WorkflowStep[]): Map<string, { x: number; y: number }> {
  const needs = new Map(steps.map((s) => [s.name, s.needs]));
  const depth = new Map<string, number>();
  const depthOf = (name: string, seen: Set<string> = new Set()): number => {
    const known = depth.get(name);
    if (known !== undefined) return known;
    if (seen.has(name)) return 0; // a cycle is refused when the run starts; never loop on one
    seen.add(name);
    const d = Math.max(-1, ...(needs.get(name) ?? []).map((n) => depthOf(n, seen))) + 1;
    depth.set(name, d);
    return d;
  };
  const rows = new Map<number, number>();
  const place = new Map<string, { x: number; y: number }>();
  for (const step of steps) {
    const d = depthOf(step.name);
    const row = rows.get(d) ?? 0;
    rows.set(d, row + 1);
    place.set(step.name, { x: d * (NODE_W + GAP_X), y: row * (NODE_H + GAP_Y) });
  }
  return place;
}
