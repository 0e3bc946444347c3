/**
 * One job: its record, its event timeline and its output, both read from history and then
 * followed live on the job's own subjects, a prompt agent's conversation and the table of its
 * model calls (both drawn from those events, so they grow live too), its result and artifacts
 * (downloaded a chunk at a time through `jobs.artifact` and checked against their digest), and
 * cancel, retry (an ended job that did not succeed, under its own id) or re-run (any ended job, as
 * a new job, with its input edited here) where the page's principal may (an admin on any job, a
 * submitter on its own; a viewer sees no button).
 */

import type { BoxcarEvent, JobRecord } from "@boxcar/protocol";
import { unfoldEvents } from "@boxcar/protocol/event-fold";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { ansiRuns } from "../ansi.js";
import type { Api } from "../api.js";
import { At, Badge, Failure, html, Took } from "../html.js";
import { Conversation } from "./conversation.js";
import { ModelCalls, money } from "./model-calls.js";
import { AttemptTimeline } from "./timeline.js";
import { Labels, saveFile, TraceId } from "./traits.js";

const ENDED = new Set(["succeeded", "failed", "timed_out", "cancelled", "dead", "expired", "rejected"]);
/** The ended states `jobs.retry` runs again under the same id (docs/reliability.md#retry-and-re-run); any ended job may be re-run. */
const RETRIABLE = new Set(["dead", "failed", "timed_out", "cancelled"]);
/** The page keeps at most this much output (the newest); the CLI's `boxcar logs` has all. */
const MAX_OUTPUT = 1 << 20;
/** The page shows at most this much of a job's input (as indented JSON); its download has all. */
const MAX_INPUT_SHOWN = 64 * 1024;

export function JobView({ api, id }: { api: Api; id: string }) {
  const [job, setJob] = useState<JobRecord | undefined>(undefined);
  const [events, setEvents] = useState<BoxcarEvent[]>([]);
  const [output, setOutput] = useState<Output>([]);
  const [error, setError] = useState<Error | undefined>(undefined);
  const [actionError, setActionError] = useState<Error | undefined>(undefined);
  const [rerunning, setRerunning] = useState(false);

  useEffect(() => {
    let gone = false;
    const stops: (() => void)[] = [];
    const seen = new Set<string>();
    const addEvents = (list: BoxcarEvent[]) => {
      const fresh = list.flatMap(unfoldEvents).filter((e) => {
        const key = JSON.stringify([e.kind, e.type, e.attempt, e.seq, e.at]);
        if (seen.has(key)) return false;
        seen.add(key);
        return true;
      });
      if (fresh.length === 0 || gone) return;
      setEvents((now) => {
        const all = [...now, ...fresh];
        // Live events come in order: sort only when one is older than the last shown.
        const ordered = fresh.every((e, i) => e.at >= (i === 0 ? (now.at(-1)?.at ?? "") : (fresh[i - 1] as BoxcarEvent).at));
        return ordered ? all : all.sort((a, b) => a.at.localeCompare(b.at));
      });
    };
    // The record is read again after a change of state, at most every 250 ms (not on progress).
    let recordTimer: ReturnType<typeof setTimeout> | undefined;
    const rereadRecord = () => {
      recordTimer ??= setTimeout(() => {
        recordTimer = undefined;
        void api.getJob(id).then((j) => !gone && setJob(j), setError);
      }, 250);
    };
    // Output is added once per frame, however many chunks come in it.
    let unshown: Output = [];
    let frame: number | undefined;
    const showOutput = (add: Output) => {
      unshown = appendOutput(unshown, add);
      frame ??= requestAnimationFrame(() => {
        frame = undefined;
        const shown = unshown;
        unshown = [];
        if (!gone) setOutput((now) => appendOutput(now, shown));
      });
    };
    const readOutput = async () => {
      let all: Output = [];
      await api.logs(id, (stream, text) => {
        all = appendOutput(all, [{ stream, text }]);
      });
      if (!gone) setOutput(all);
    };
    (async () => {
      const first = await api.getJob(id);
      if (gone) return;
      setJob(first);
      const owner = first.owner ?? "local";
      // Live first, then history, then the record again, so nothing that happens in between is
      // missed. Followed whatever the state: an ended job may be retried. Output that comes
      // while the history is read may show twice until the job ends, when the whole output is
      // read again from the store.
      let pending: Output = [];
      let historyRead = false;
      const utf8 = { stdout: new TextDecoder(), stderr: new TextDecoder() };
      stops.push(
        api.followBytes(api.names.subjects.jobLogs(owner, id), (data, subject) => {
          const stream = subject.endsWith(".stderr") ? "stderr" : "stdout";
          const piece = [{ stream, text: utf8[stream].decode(data, { stream: true }) }] as const;
          if (historyRead) showOutput([...piece]);
          else pending = appendOutput(pending, [...piece]);
        }),
      );
      const onEvent = (event: BoxcarEvent) => {
        addEvents([event]);
        if (event.kind !== "job" || event.type === "progress") return;
        rereadRecord();
        if (ENDED.has(event.state)) void readOutput();
      };
      // One subscription per kind: a submitter may subscribe to its own job and sandbox events, not to any kind's.
      for (const kind of ["job", "sandbox"] as const) stops.push(api.follow(api.names.subjects.event(kind, id, "*", owner), onEvent));
      const history = await api.history("jobs.events", id);
      addEvents(history.events);
      await readOutput();
      historyRead = true;
      if (pending.length > 0) showOutput(pending);
      const again = await api.getJob(id);
      if (!gone) setJob(again);
    })().catch((err: Error) => !gone && setError(err));
    return () => {
      gone = true;
      if (recordTimer !== undefined) clearTimeout(recordTimer);
      if (frame !== undefined) cancelAnimationFrame(frame);
      for (const stop of stops) stop();
    };
  }, [id]);

  const act = async (endpoint: "jobs.cancel" | "jobs.retry") => {
    setActionError(undefined);
    try {
      setJob((await api.request<{ job: JobRecord }>(endpoint, { id })).job);
    } catch (err) {
      setActionError(err as Error);
    }
  };

  if (error) return html`<section><h1>Job ${id}</h1><${Failure} error=${error} /></section>`;
  if (!job) return html`<section><h1>Job ${id}</h1><p>Loading…</p></section>`;
  const mayAct = api.mayAct(job.owner);
  return html`
    <section class="job">
      <h1>Job <code>${job.id}</code> <${Badge} state=${job.state} /></h1>
      <div class="actions">
        ${mayAct && !ENDED.has(job.state) && html`<button data-action="cancel" disabled=${job.cancelRequested} onClick=${() => act("jobs.cancel")}>${job.cancelRequested ? "Cancelling…" : "Cancel"}</button>`}
        ${mayAct && RETRIABLE.has(job.state) && html`<button data-action="retry" onClick=${() => act("jobs.retry")}>Retry</button>`}
        ${mayAct && ENDED.has(job.state) && job.spec && html`<button data-action="rerun" aria-expanded=${rerunning ? "true" : "false"} onClick=${() => setRerunning(!rerunning)}>Re-run…</button>`}
      </div>
      <${Failure} error=${actionError} />
      ${rerunning && mayAct && ENDED.has(job.state) && job.spec && html`<${RerunEditor} api=${api} job=${job} onClose=${() => setRerunning(false)} />`}
      <dl class="facts">
        <dt>agent</dt><dd>${job.agent}</dd>
        <dt>pool</dt><dd>${job.pool}</dd>
        <dt>owner</dt><dd>${job.owner ?? "local"}</dd>
        <dt>attempt</dt><dd data-attempt>${job.attempt}</dd>
        <dt>created</dt><dd data-created><${At} iso=${job.createdAt} /></dd>
        ${job.startedAt && html`<dt>ran</dt><dd data-ran><${Took} from=${job.startedAt} to=${job.finishedAt} live=${job.state === "running"} />${job.workerId ? ` on ${job.workerId}` : ""}</dd>`}
        ${job.sandbox && html`<dt>sandbox</dt><dd>${job.sandbox.kind}: ${job.sandbox.reason}</dd>`}
        ${job.result && exitOf(job.result) && html`<dt>exit</dt><dd data-exit>${exitOf(job.result)}</dd>`}
        ${job.usage && html`<dt>usage</dt><dd data-usage>${job.usage.calls} calls: ${job.usage.tokensIn} tokens in, ${job.usage.tokensOut} out, cost ${money(job.usage.cost)}</dd>`}
        ${job.rerunOf && html`<dt>re-run of</dt><dd data-rerun-of><a href=${`#/job/${job.rerunOf}`}>${job.rerunOf}</a></dd>`}
        ${job.chain?.run && html`<dt>workflow run</dt><dd><a href=${`#/run/${job.chain.run}`}>${job.chain.run}</a></dd>`}
        ${job.handoff?.jobId && html`<dt>handed off to</dt><dd><a href=${`#/job/${job.handoff.jobId}`}>${job.handoff.to} (${job.handoff.jobId})</a></dd>`}
        ${Object.keys(job.spec?.labels ?? {}).length > 0 && html`<dt>labels</dt><dd><${Labels} labels=${job.spec?.labels ?? {}} /></dd>`}
        ${job.traceparent && html`<dt>trace</dt><dd><${TraceId} api=${api} traceparent=${job.traceparent} /></dd>`}
      </dl>
      ${job.error && html`<p class="error" data-error>${job.error.code}: ${job.error.message}</p>`}
      ${
        job.result &&
        (job.result.summary || job.result.output !== null) &&
        html`<h2>Result</h2>
        ${job.result.summary && html`<p class="summary" data-summary>${job.result.summary}</p>`}
        ${job.result.output !== null && html`<pre class="result" data-result>${JSON.stringify(job.result.output, null, 2)}</pre>`}`
      }
      <${AttemptTimeline} job=${job} events=${events} />
      ${job.spec && html`<${InputView} job=${job} />`}
      ${
        job.artifacts.length > 0 &&
        html`<h2>Artifacts</h2>
        <ul class="artifacts">${job.artifacts.map((a) => html`<li><${Download} api=${api} jobId=${job.id} path=${a.path} size=${a.size} /></li>`)}</ul>`
      }
      <${Conversation} events=${events} />
      <${ModelCalls} events=${events} />
      <h2>Events</h2>
      <ol class="timeline" data-timeline>
        ${events.map((e) => html`<li data-event=${`${e.kind}.${e.type}`}><time datetime=${e.at} title=${e.at}>${e.at.slice(11, 23)}</time> <b>${e.kind}</b> ${e.type} <span>${describe(e)}</span></li>`)}
      </ol>
      <h2>Output</h2>
      <${OutputView} output=${output} />
    </section>
  `;
}

function OutputView({ output }: { output: Output }) {
  const ref = useRef<HTMLPreElement>(null);
  // Follows the end of the output unless the reader scrolled up.
  const following = useRef(true);
  useEffect(() => {
    const el = ref.current;
    if (el && following.current) el.scrollTop = el.scrollHeight;
  }, [output]);
  const onScroll = () => {
    const el = ref.current;
    if (el) following.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
  };
  // stderr in a colour of its own; terminal colour codes shown in their colours, as text.
  return html`<pre class="output" data-output ref=${ref} onScroll=${onScroll}>${output.map((part) =>
    part.stream === "stderr"
      ? html`<span class="stderr">${html`<${Styled} text=${part.text} />`}</span>`
      : html`<${Styled} text=${part.text} />`,
  )}</pre>`;
}

/** Text with its terminal colour codes as spans: each run a text child, never HTML; parsed again only when the text changed. */
function Styled({ text }: { text: string }) {
  const runs = useMemo(() => ansiRuns(text), [text]);
  return runs.map((run) =>
    run.classes === "" && !run.color && !run.background
      ? run.text
      : html`<span class=${run.classes || undefined} style=${run.color || run.background ? { color: run.color, backgroundColor: run.background } : undefined}>${run.text}</span>`,
  );
}

/** The job's input as indented JSON, its first 64 KiB on the page, all of it in a download made here; and its input files. */
function InputView({ job }: { job: JobRecord }) {
  const input = job.spec?.input ?? null;
  const files = job.spec?.files ?? [];
  const text = useMemo(() => JSON.stringify(input, null, 2), [input]);
  const cut = text.length > MAX_INPUT_SHOWN;
  const download = () => saveFile(`${job.id}-input.json`, `${text}\n`, "application/json");
  return html`
    <h2>Input <button class="link small" data-input-download onClick=${download}>download</button></h2>
    ${
      input === null && files.length > 0
        ? null
        : html`<pre class="input" data-input>${cut ? text.slice(0, MAX_INPUT_SHOWN) : text}</pre>
          ${cut && html`<p class="note" data-input-cut>The first ${kib(MAX_INPUT_SHOWN)} of ${kib(text.length)}: the download has all of it.</p>`}`
    }
    ${
      files.length > 0 &&
      html`<ul class="input-files" data-input-files>${files.map((f) => html`<li><code>${f.path}</code> <span class="note">from ${f.object}</span></li>`)}</ul>`
    }
  `;
}

/**
 * Re-run: the job's input as indented JSON in a textarea (its value, never markup), checked as
 * JSON here before anything is sent; then `jobs.rerun` with it, and the new job's page.
 */
function RerunEditor({ api, job, onClose }: { api: Api; job: JobRecord; onClose: () => void }) {
  const [text, setText] = useState(() => JSON.stringify(job.spec?.input ?? null, null, 2));
  const [invalid, setInvalid] = useState<string | undefined>(undefined);
  const [error, setError] = useState<Error | undefined>(undefined);
  const [sending, setSending] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    let input: unknown;
    try {
      input = JSON.parse(text);
    } catch (err) {
      setInvalid(`The input is not JSON, nothing was sent: ${(err as Error).message}`);
      return;
    }
    setInvalid(undefined);
    setSending(true);
    try {
      const { job: fresh } = await api.request<{ job: JobRecord }>("jobs.rerun", { id: job.id, input });
      location.hash = `#/job/${encodeURIComponent(fresh.id)}`;
    } catch (err) {
      setError(err as Error);
      setSending(false);
    }
  };
  const lines = Math.min(20, Math.max(4, text.split("\n").length + 1));
  return html`
    <div class="rerun" data-rerun>
      <p class="note">Runs this job's spec again as a new job (same agent, labels, pool and files) with this input:</p>
      <textarea data-rerun-input aria-label="input of the new job (JSON)" spellcheck="false" rows=${lines} value=${text}
        onInput=${(e: Event) => {
          setText((e.target as HTMLTextAreaElement).value);
          setInvalid(undefined);
        }}
        onKeyDown=${(e: KeyboardEvent) => (e.ctrlKey || e.metaKey) && e.key === "Enter" && void submit(e)}></textarea>
      ${invalid && html`<p class="error" role="alert" data-rerun-error>${invalid}</p>`}
      <${Failure} error=${error} />
      <div class="actions">
        <button data-action="rerun-submit" disabled=${sending} onClick=${submit}>${sending ? "Submitting…" : "Run as a new job"}</button>
        <button class="link" data-action="rerun-close" onClick=${onClose}>close</button>
      </div>
    </div>
  `;
}

function kib(chars: number): string {
  return `${Math.round(chars / 1024)} KiB`;
}

/** How the agent's process ended: `exit 1`, `signal SIGKILL`, `out of memory`; "" when nothing says. */
function exitOf(result: NonNullable<JobRecord["result"]>): string {
  if (result.oomKilled) return "killed: out of memory";
  if (result.signal) return `signal ${result.signal}`;
  if (result.exitCode !== null && result.exitCode !== undefined) return `exit ${result.exitCode}`;
  return "";
}

/** A button that downloads one artifact as a file: never opened in the page (an HTML artifact must not run here). */
function Download({ api, jobId, path, size }: { api: Api; jobId: string; path: string; size: number }) {
  const [state, setState] = useState<string>("");
  const download = async () => {
    setState("downloading…");
    try {
      const blob = await api.artifact(jobId, path);
      saveFile(path.split("/").pop() ?? "artifact", blob, "application/octet-stream");
      setState("");
    } catch (err) {
      setState((err as Error).message);
    }
  };
  return html`<button class="link" data-artifact=${path} onClick=${download}>${path}</button> <span class="size">${size} bytes</span> ${state && html`<span class="note">${state}</span>`}`;
}

function describe(e: BoxcarEvent): string {
  if (e.kind === "job") {
    return [
      e.workerId && e.type === "started" ? `on ${e.workerId}` : "",
      e.message ?? "",
      e.error ? `${e.error.code}: ${e.error.message}` : "",
    ]
      .filter(Boolean)
      .join(" · ");
  }
  if (e.kind === "sandbox") {
    return [
      `${e.backend} ${e.sandboxId}`,
      e.start ?? "",
      e.exitCode !== undefined && e.exitCode !== null ? `exit ${e.exitCode}` : "",
      e.durationMs !== undefined ? `${Math.round(e.durationMs)} ms` : "",
    ]
      .filter(Boolean)
      .join(" · ");
  }
  return "";
}

/** Output as runs of one stream's text, in order. */
type Output = { stream: "stdout" | "stderr"; text: string }[];

/** `add` after `now`, a run joined to the last when of the same stream, the oldest text dropped past `MAX_OUTPUT`. */
function appendOutput(now: Output, add: Output): Output {
  const all = [...now];
  for (const part of add) {
    const last = all.at(-1);
    if (last?.stream === part.stream) all[all.length - 1] = { stream: part.stream, text: last.text + part.text };
    else all.push(part);
  }
  let size = all.reduce((n, p) => n + p.text.length, 0);
  while (size > MAX_OUTPUT && all.length > 0) {
    const first = all[0] as Output[number];
    const over = size - MAX_OUTPUT;
    if (first.text.length <= over) {
      all.shift();
      size -= first.text.length;
    } else {
      all[0] = { stream: first.stream, text: first.text.slice(over) };
      size = MAX_OUTPUT;
    }
  }
  return all;
}
