import { type BoxcarEvent, type JobRecord, limitNamed, type ScheduleRecord } from "@boxcar/protocol";

/** Renders rows as an aligned text table with a header. */
export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return [line(header), ...rows.map(line)].join("\n");
}

export function json(value: unknown): string {
  return JSON.stringify(value, null, 2);
}

export function ago(iso: string | undefined, now = Date.now()): string {
  if (!iso) return "-";
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

export function duration(from?: string, to?: string): string {
  if (!from || !to) return "-";
  const ms = Date.parse(to) - Date.parse(from);
  return ms < 1000 ? `${ms}ms` : `${(ms / 1000).toFixed(1)}s`;
}

/** A job's state, with what a queued one waits for: its time (`later`) or a place under a concurrency limit (`limit`). */
export function stateOf(job: JobRecord): string {
  if (job.state !== "queued") return job.state;
  if (job.concurrency?.waiting) return "queued (limit)";
  return job.runAt && Date.parse(job.runAt) > Date.now() ? "queued (later)" : "queued";
}

/** A human summary of one job record, several lines. */
export function describeJob(job: JobRecord): string {
  const lines = [
    `job       ${job.id}`,
    `agent     ${job.agent} (pool ${job.pool}, ${job.priority ?? "normal"} priority)`,
    `state     ${job.state}${job.cancelRequested && job.state === "running" ? " (cancel requested)" : ""}`,
    `attempt   ${job.attempt}`,
    `created   ${job.createdAt}`,
  ];
  if (job.workerId) lines.push(`worker    ${job.workerId}`);
  if (job.runAt && job.state === "queued" && Date.parse(job.runAt) > Date.now()) lines.push(`runs at   ${job.runAt}`);
  if (job.concurrency?.waiting && job.state === "queued") lines.push(`waits     for a place under ${limitNamed(job.concurrency)}`);
  if (job.signals?.length)
    lines.push(`signals   ${job.signals.map((s) => s.name).join(", ")} (sent before it started; written at each attempt)`);
  if (job.session) lines.push(`session   ${job.session.id} (worker ${job.session.workerId})`);
  if (job.schedule) lines.push(`schedule  ${job.schedule.name} (tick ${job.schedule.tick})`);
  if (job.usage) {
    const u = job.usage;
    lines.push(`usage     ${u.calls} calls: ${u.tokensIn} tokens in, ${u.tokensOut} out, cost ${u.cost}`);
  }
  if (job.sandbox) lines.push(`sandbox   ${job.sandbox.kind} ${job.sandbox.id} (${job.sandbox.reason})`);
  if (job.startedAt) lines.push(`ran       ${duration(job.startedAt, job.finishedAt ?? new Date().toISOString())}`);
  if (job.result) {
    lines.push(`exit      ${job.result.exitCode ?? "-"}${job.result.signal ? ` (signal ${job.result.signal})` : ""}`);
    if (job.result.summary) lines.push(`summary   ${job.result.summary}`);
    if (job.result.output !== null) lines.push(`output    ${JSON.stringify(job.result.output)}`);
  }
  if (job.error) lines.push(`error     ${job.error.code}: ${job.error.message}`);
  for (const h of job.history) lines.push(`attempt ${h.attempt} ${h.state}${h.error ? `: ${h.error.code}: ${h.error.message}` : ""}`);
  for (const issue of job.error?.issues ?? []) lines.push(`          - ${issue.path || "(body)"}: ${issue.message}`);
  if (job.artifacts.length > 0) {
    lines.push("artifacts");
    for (const a of job.artifacts) lines.push(`          ${a.path} (${a.size} bytes)`);
  }
  return lines.join("\n");
}

/** Milliseconds in the largest unit that writes them whole: `90s`, `10m`, `1d`. */
export function span(ms: number): string {
  const units: [string, number][] = [
    ["d", 86_400_000],
    ["h", 3_600_000],
    ["m", 60_000],
    ["s", 1_000],
  ];
  const [unit, size] = units.find(([, size]) => ms >= size && ms % size === 0) ?? ["ms", 1];
  return `${ms / size}${unit}`;
}

/** A schedule's last tick and what was done at it (`-` before its first). */
export function lastTick(schedule: ScheduleRecord): string {
  const { tick, action } = schedule.state;
  return tick ? `${tick} ${action ?? ""}`.trimEnd() : "-";
}

/** A human summary of one schedule record, several lines. */
export function describeSchedule(schedule: ScheduleRecord): string {
  const { definition: d, state } = schedule;
  const job = d.job;
  const runs = [
    job.pool ? `pool ${job.pool}` : undefined,
    job.priority ? `${job.priority} priority` : undefined,
    job.timeout !== undefined ? `timeout ${span(job.timeout)}` : undefined,
  ].filter(Boolean);
  const lines = [
    `schedule  ${d.name}`,
    `owner     ${schedule.owner}`,
    `cron      ${d.cron} (${d.timezone})`,
    `state     ${schedule.paused ? "paused" : "active"}`,
  ];
  if (schedule.next) lines.push(`next      ${schedule.next}`);
  lines.push(`agent     ${job.agent}${runs.length > 0 ? ` (${runs.join(", ")})` : ""}`);
  if (job.input !== null) lines.push(`input     ${JSON.stringify(job.input)}`);
  const labels = Object.entries(job.labels);
  if (labels.length > 0) lines.push(`labels    ${labels.map(([k, v]) => `${k}=${v}`).join(" ")}`);
  lines.push(`overlap   ${d.overlap}`);
  lines.push(`catch-up  ${d.catchUp}${d.catchUp === "all" ? ` (within ${span(d.catchUpWindow)})` : ""}`);
  lines.push(`last      ${lastTick(schedule)}`);
  if (state.jobId) lines.push(`last job  ${state.jobId}${state.jobTick ? ` (tick ${state.jobTick})` : ""}`);
  if (state.pending) lines.push(`pending   ${state.pending} (fires when the last job ends)`);
  lines.push(`ticks     ${state.fired} fired, ${state.skipped} skipped, ${state.missed} missed`);
  lines.push(`created   ${schedule.createdAt}`);
  if (schedule.resumedAt) lines.push(`resumed   ${schedule.resumedAt}`);
  return lines.join("\n");
}

/** One event as a line for people. */
export function describeEvent(event: BoxcarEvent): string {
  const time = event.at.slice(11, 23);
  if (event.kind === "job") {
    const detail = [
      event.message === event.error?.message ? undefined : event.message, // the error says it
      event.workerId && event.type === "started" ? `on ${event.workerId}` : undefined,
      event.sandbox && event.type === "started" ? `in ${event.sandbox.kind} (${event.sandbox.reason})` : undefined,
      event.error ? `${event.error.code}: ${event.error.message}` : undefined,
    ].filter(Boolean);
    return `${time}  job      ${event.type.padEnd(16)} ${detail.join("  ")}`.trimEnd();
  }
  if (event.kind === "sandbox") {
    const detail = [
      `${event.backend} ${event.sandboxId}`,
      event.exitCode !== undefined ? `exit ${event.exitCode ?? "-"}` : undefined,
      event.signal ? `signal ${event.signal}` : undefined,
      event.durationMs !== undefined ? `${Math.round(event.durationMs)}ms` : undefined,
      event.error ? `${event.error.code}: ${event.error.message}` : undefined,
    ].filter(Boolean);
    return `${time}  sandbox  ${event.type.padEnd(16)} ${detail.join("  ")}`;
  }
  if (event.kind === "session") {
    const detail = [
      event.execId,
      event.exitCode !== undefined ? `exit ${event.exitCode ?? "-"}` : undefined,
      event.signal ? `signal ${event.signal}` : undefined,
      event.durationMs !== undefined ? `${Math.round(event.durationMs)}ms` : undefined,
      event.snapshot,
      event.reason,
    ].filter(Boolean);
    return `${time}  session  ${event.type.padEnd(16)} ${detail.join("  ")}`.trimEnd();
  }
  return `${time}  worker   ${event.type.padEnd(16)} ${event.workerId}`;
}
