/**
 * Where a job's time went, and a run's: horizontal bars on one time axis. A job has a bar per
 * attempt, cut into its phases from the job's own events (queue wait from queued, or the last
 * attempt's end, to `started`; sandbox start to the sandbox's `exec_started`; the run to
 * `exec_exited`; copy-out, the artifacts, the result file and the sandbox's removal, to the
 * attempt's last event), its model calls marked on it. A run has a bar per step, from the
 * step's start to its end as the run's record says. Something still running grows each second.
 */

import type { BoxcarEvent, JobRecord, WorkflowRun } from "@boxcar/protocol";
import { html, millis, useNow, when } from "../html.js";

/** One piece of a bar. */
interface Segment {
  /** Its class and `data-phase`: `queue`, `start`, `run`, `copy`; a step's state. */
  readonly phase: string;
  readonly label: string;
  readonly from: number;
  readonly to: number;
  /** Still going: it ends now. */
  readonly live?: boolean;
}

interface Bar {
  readonly key: string;
  readonly label: string;
  /** What the bar's end was (a state), shown after its durations. */
  readonly outcome?: string;
  readonly segments: readonly Segment[];
  readonly markers?: readonly { at: number; title: string }[];
}

const PHASES: readonly [string, string][] = [
  ["queue", "queue wait"],
  ["start", "sandbox start"],
  ["run", "run"],
  ["copy", "copy-out"],
];

/** The events that end an attempt (the job's state after it, or its next attempt). */
const ATTEMPT_ENDS = new Set(["succeeded", "failed", "timed_out", "cancelled", "dead", "expired", "retrying", "requeued"]);
const ENDED = new Set(["succeeded", "failed", "timed_out", "cancelled", "dead", "expired", "rejected"]);

interface Marks {
  waitFrom?: number;
  started?: number;
  execStarted?: number;
  execExited?: number;
  end?: number;
  endType?: string;
  sandbox?: string;
  calls: { at: number; title: string }[];
}

/** The attempts of a job, each cut into its phases, from its events in order of time. */
export function attemptBars(job: JobRecord, events: readonly BoxcarEvent[], now: number): Bar[] {
  const attempts = new Map<number, Marks>();
  // (Not `queuedAt`: a retried job's is its last requeue.)
  const first = Date.parse(job.createdAt);
  // When the next attempt began to wait: admission, then each attempt's end.
  let waitFrom: number | undefined = Number.isNaN(first) ? undefined : first;
  const marks = (n: number): Marks => {
    let m = attempts.get(n);
    if (!m) {
      m = { calls: [] };
      attempts.set(n, m);
    }
    return m;
  };
  for (const e of events) {
    const at = Date.parse(e.at);
    if (Number.isNaN(at)) continue;
    if (e.kind === "job") {
      if (e.type === "started") {
        const m = marks(e.attempt);
        m.started ??= at;
        if (waitFrom !== undefined && waitFrom <= at) m.waitFrom ??= waitFrom;
        waitFrom = undefined;
      } else if (e.type === "model_call") {
        const call = (e.call ?? {}) as Record<string, unknown>;
        marks(e.attempt).calls.push({
          at,
          title: `model call: ${String(call.provider ?? "")} ${String(call.model ?? "")} ${String(call.status ?? "")}`.trim(),
        });
      } else if (ATTEMPT_ENDS.has(e.type)) {
        const m = attempts.get(e.attempt);
        if (m?.started !== undefined && m.end === undefined) {
          m.end = at;
          m.endType = e.type;
          waitFrom = at;
        } else if (e.type === "retrying") waitFrom = at; // `jobs.retry` on a dead job: a new wait from now
      } else if (e.type === "queued") waitFrom ??= at;
    } else if (e.kind === "sandbox") {
      const m = marks(e.attempt);
      m.sandbox ??= e.backend;
      if (e.type === "exec_started") m.execStarted ??= at;
      else if (e.type === "exec_exited") m.execExited ??= at;
    }
  }
  const ended = ENDED.has(job.state);
  const finished = job.finishedAt ? Date.parse(job.finishedAt) : undefined;
  const bars: Bar[] = [];
  const numbers = [...attempts.keys()].filter((n) => attempts.get(n)?.started !== undefined).sort((a, b) => a - b);
  for (const [i, n] of numbers.entries()) {
    const m = attempts.get(n) as Marks;
    const last = i === numbers.length - 1;
    // An attempt with no last event of its own ends with the job, or, the job's last and still going, now.
    const end = m.end ?? (last ? (ended ? (finished ?? now) : now) : (m.execExited ?? m.execStarted ?? m.started ?? now));
    const live = m.end === undefined && last && !ended;
    const points: [string, number | undefined][] = [
      ["queue", m.waitFrom],
      ["start", m.started],
      ["run", m.execStarted],
      ["copy", m.execExited],
    ];
    const present = points.filter((p): p is [string, number] => p[1] !== undefined && p[1] <= end);
    const segments = present.map(([phase, from], k) => {
      const next = present[k + 1];
      return {
        phase,
        label: PHASES.find(([p]) => p === phase)?.[1] ?? phase,
        from,
        to: next ? next[1] : end,
        ...(live && !next ? { live: true } : {}),
      };
    });
    bars.push({
      key: `attempt-${n}`,
      label: `attempt ${n}`,
      ...(m.endType ? { outcome: m.endType } : live ? { outcome: "running" } : {}),
      segments,
      markers: m.calls,
    });
  }
  // Not started yet (or never): its wait alone.
  if (waitFrom !== undefined && (numbers.length === 0 || job.state === "queued")) {
    const next = (numbers.at(-1) ?? 0) + 1;
    bars.push({
      key: `attempt-${next}`,
      label: ended ? "never started" : `attempt ${next}`,
      outcome: ended ? job.state : "waiting",
      segments: [
        { phase: "queue", label: "queue wait", from: waitFrom, to: ended ? (finished ?? now) : now, ...(ended ? {} : { live: true }) },
      ],
    });
  }
  return bars;
}

/** A job's attempts on one axis, growing each second while the job has not ended. */
export function AttemptTimeline({ job, events }: { job: JobRecord; events: readonly BoxcarEvent[] }) {
  const now = useNow(!ENDED.has(job.state));
  const bars = attemptBars(job, events, now);
  if (bars.length === 0) return null;
  return html`<h2>Timeline</h2><${Gantt} bars=${bars} legend=${PHASES} kind="attempt" />`;
}

/** A run's steps, in the workflow's order: each from its start to its end (or now). */
export function stepBars(run: WorkflowRun, now: number): Bar[] {
  const runEnd = run.finishedAt ? Date.parse(run.finishedAt) : now;
  return run.workflow.steps.flatMap((step) => {
    const s = run.steps[step.name];
    if (!s?.startedAt) return [];
    const from = Date.parse(s.startedAt);
    const to = s.finishedAt ? Date.parse(s.finishedAt) : runEnd;
    const live = !s.finishedAt && run.state === "running";
    const jobs = s.instances.length;
    const kind = step.agent ? (jobs > 1 ? `${jobs} jobs of ${step.agent}` : step.agent) : "approval";
    return [
      {
        key: step.name,
        label: step.name,
        outcome: s.state,
        segments: [{ phase: `step-${s.state}`, label: kind, from, to, ...(live ? { live: true } : {}) }],
      },
    ];
  });
}

/** A run's steps on one axis from the run's start, growing each second while it runs. */
export function StepTimeline({ run }: { run: WorkflowRun }) {
  const now = useNow(run.state === "running");
  const bars = stepBars(run, now);
  if (bars.length === 0) return null;
  const start = Date.parse(run.createdAt);
  return html`<h2>Timeline</h2><${Gantt} bars=${bars} start=${start} kind="step" />`;
}

/** Bars on one time axis, from `start` (or the earliest segment) to the latest end. */
function Gantt({
  bars,
  start,
  legend,
  kind,
}: {
  bars: readonly Bar[];
  start?: number;
  legend?: readonly [string, string][];
  kind: string;
}) {
  const all = bars.flatMap((b) => b.segments);
  const from = Math.min(start ?? Number.POSITIVE_INFINITY, ...all.map((s) => s.from));
  const to = Math.max(from + 1, ...all.map((s) => s.to));
  const span = to - from;
  const pct = (ms: number) => `${((ms / span) * 100).toFixed(3)}%`;
  return html`
    <div class="gantt" data-gantt=${kind}>
      <div class="gantt-axis"><span>${when(new Date(from).toISOString())}</span><span>${millis(span)}</span></div>
      ${bars.map(
        (bar) => html`
        <div class="gantt-row" data-bar=${bar.key} data-outcome=${bar.outcome}>
          <div class="gantt-label">${bar.label}</div>
          <div class="gantt-track">
            ${bar.segments.map(
              (s) => html`<div
                class=${`gantt-seg phase-${s.phase}${s.live ? " live" : ""}`}
                data-phase=${s.phase}
                data-from=${Math.round(s.from - from)}
                data-to=${Math.round(s.to - from)}
                data-ms=${Math.round(s.to - s.from)}
                title=${`${s.label}: ${millis(s.to - s.from)}${s.live ? " so far" : ""}`}
                style=${{ left: pct(s.from - from), width: pct(Math.max(0, s.to - s.from)) }}
              ><span>${millis(s.to - s.from)}</span></div>`,
            )}
            ${(bar.markers ?? []).map(
              (m) =>
                html`<div class="gantt-marker" data-marker title=${`${m.title} at ${when(new Date(m.at).toISOString())}`} style=${{ left: pct(m.at - from) }}></div>`,
            )}
          </div>
          <div class="gantt-detail">
            ${bar.segments.map((s) => html`<span class=${`phase-label phase-${s.phase}`}>${s.label} ${millis(s.to - s.from)}</span>`)}
            ${bar.outcome && html`<span class="outcome">${bar.outcome}</span>`}
          </div>
        </div>`,
      )}
      ${legend && html`<div class="gantt-legend">${legend.map(([p, label]) => html`<span class=${`phase-label phase-${p}`}>${label}</span>`)}</div>`}
    </div>
  `;
}
