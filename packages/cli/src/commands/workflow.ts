import type { BoxcarClient } from "@boxcar/client";
import { type BoxcarEvent, RunState, type StepRun, type WorkflowRun } from "@boxcar/protocol";
import type { Command, Values } from "../command.js";
import type { CommandContext } from "../context.js";
import { ExitCode } from "../exit-codes.js";
import { jsonPayload } from "../json-input.js";
import { ago, describeEvent, duration, json, table } from "../output.js";
import { UsageError } from "../usage-error.js";

const usage =
  "boxcar workflow status RUN | events RUN [--follow] | cancel RUN | approve RUN STEP [--comment TEXT] | reject RUN STEP [--comment TEXT] | signal RUN NAME [--payload JSON] | ls [--state STATE] [--workflow NAME] [--awaiting] [--limit N] [--after CURSOR]";

/** Exit code of a command that waited for a run: 0 when it succeeded. */
export const exitForRun = (run: WorkflowRun): number => (run.state === "succeeded" ? ExitCode.ok : ExitCode.jobFailed);

/** At most `max` characters of a value, as JSON on one line. */
function brief(value: unknown, max = 80): string {
  const text = typeof value === "string" ? value : (JSON.stringify(value) ?? "");
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** The jobs of one chain: `a`, `a → b`, or `a → … → z (5 jobs)`. */
function chainOf(jobs: readonly string[]): string {
  if (jobs.length === 0) return "-";
  return jobs.length <= 2 ? jobs.join(" → ") : `${jobs[0]} → … → ${jobs.at(-1)} (${jobs.length} jobs)`;
}

/** A human summary of a workflow run: its state, each step (and each item of a fan-out), its output. */
export function describeRun(run: WorkflowRun): string {
  const lines = [
    `run       ${run.id}`,
    `workflow  ${run.workflow.name} (${run.workflow.steps.length} steps)`,
    `state     ${run.state}`,
    `created   ${run.createdAt}`,
  ];
  if (run.finishedAt) lines.push(`ran       ${duration(run.createdAt, run.finishedAt)}`);
  if (run.deadline && run.state === "running") lines.push(`deadline  ${run.deadline}`);
  const labels = Object.entries(run.labels);
  if (labels.length > 0) lines.push(`labels    ${labels.map(([k, v]) => `${k}=${v}`).join(" ")}`);
  if (run.input !== null) lines.push(`input     ${brief(run.input, 120)}`);
  const rows: string[][] = [];
  for (const step of run.workflow.steps) {
    const state = run.steps[step.name] as StepRun | undefined;
    if (!state) continue;
    if (step.approval) {
      const a = state.approval;
      const detail = a?.decision
        ? `${a.decision} by ${a.by}${a.comment ? `: ${a.comment}` : ""}`
        : a && state.state === "running"
          ? `waits for an approval by ${step.approval.approvers.join(", ") || "the run's owner"} until ${a.deadline}`
          : "";
      rows.push([step.name, state.state, "approval", state.reason ?? detail]);
      continue;
    }
    if (step.forEach === undefined) {
      const inst = state.instances[0];
      rows.push([step.name, state.state, chainOf(inst?.jobs ?? []), state.reason ?? instanceDetail(inst)]);
      continue;
    }
    const counts = new Map<string, number>();
    for (const inst of state.instances) counts.set(inst.state, (counts.get(inst.state) ?? 0) + 1);
    const tally = [...counts].map(([s, n]) => `${n} ${s}`).join(", ");
    rows.push([step.name, state.state, `${state.instances.length} items`, state.reason ?? tally]);
    for (const inst of state.instances) rows.push([`  [${inst.index}]`, inst.state, chainOf(inst.jobs), instanceDetail(inst)]);
  }
  lines.push("steps");
  lines.push(
    ...table(["STEP", "STATE", "JOBS", "DETAIL"], rows)
      .split("\n")
      .map((l) => `  ${l}`),
  );
  if (run.output !== undefined) lines.push(`output    ${brief(run.output, 400)}`);
  if (run.error) lines.push(`error     ${run.error.code}: ${run.error.message}`);
  return lines.join("\n");
}

function instanceDetail(inst: StepRun["instances"][number] | undefined): string {
  if (!inst) return "";
  if (inst.error && inst.state !== "succeeded") return `${inst.error.code}: ${inst.error.message}`;
  if (inst.summary) return inst.summary;
  return inst.output !== undefined && inst.output !== null ? brief(inst.output) : "";
}

/**
 * Writes a run's events, its jobs' and their sandboxes' as lines for people: each tagged with
 * the step (and fan-out item) it belongs to. A job's step is learned from the run's events, or
 * from the job's record (its `chain`) when its events come first.
 */
export class RunEventPrinter {
  private readonly tags = new Map<string, string>();
  private readonly width: number;

  constructor(
    private readonly client: BoxcarClient,
    run: WorkflowRun,
  ) {
    this.width = Math.max(8, ...run.workflow.steps.map((s) => s.name.length + (s.forEach !== undefined ? 4 : 0)));
  }

  async line(event: BoxcarEvent): Promise<string> {
    const time = event.at.slice(11, 23);
    if (event.kind === "workflow") {
      const tag = event.step ? stepTag(event.step, event.index) : "";
      if (event.jobId && tag) this.tags.set(event.jobId, tag);
      const detail = [
        event.type === "step_started" && event.jobId ? `job ${event.jobId}` : event.message,
        event.type === "step_finished" && !event.message ? event.stepState : undefined,
        event.error && event.error.message !== event.message ? `${event.error.code}: ${event.error.message}` : undefined,
      ].filter(Boolean);
      return `${time}  ${tag.padEnd(this.width)}  workflow ${event.type.padEnd(16)} ${detail.join("  ")}`.trimEnd();
    }
    const jobId = event.kind === "worker" || event.kind === "session" ? undefined : event.jobId;
    const tag = jobId ? await this.tagOf(jobId) : "";
    const line = describeEvent(event);
    // describeEvent starts with the time and two spaces: put the step after them.
    return `${time}  ${tag.padEnd(this.width)}  ${line.slice(time.length + 2)}`;
  }

  private async tagOf(jobId: string): Promise<string> {
    const known = this.tags.get(jobId);
    if (known !== undefined) return known;
    const job = await this.client.getJob(jobId).catch(() => undefined);
    const tag = job?.chain?.step ? stepTag(job.chain.step, job.chain.index) : (job?.agent ?? "");
    this.tags.set(jobId, tag);
    return tag;
  }
}

const stepTag = (step: string, index: number | undefined): string => (index === undefined ? step : `${step}[${index}]`);

/** Prints a run's events (followed until the run ends, with `follow`) to `write`. */
export async function printRunEvents(
  ctx: CommandContext<Values>,
  client: BoxcarClient,
  run: WorkflowRun,
  follow: boolean,
  write: (line: string) => void,
): Promise<void> {
  const printer = new RunEventPrinter(client, run);
  for await (const event of client.runEvents(run.id, { follow, signal: ctx.io.signal })) {
    write(ctx.values.json ? JSON.stringify(event) : await printer.line(event));
  }
}

function oneRun(args: string[], verb: string): string {
  const [id, ...rest] = args;
  if (!id || rest.length > 0) throw new UsageError(`workflow ${verb} needs one RUN\n\nusage: ${usage}`);
  return id;
}

export const workflow: Command = {
  usage,
  maxArgs: 3,
  options: {
    follow: { type: "boolean", short: "f", default: false },
    state: { type: "string" },
    workflow: { type: "string" },
    awaiting: { type: "boolean", default: false },
    limit: { type: "string" },
    after: { type: "string" },
    comment: { type: "string" },
    payload: { type: "string" },
  },
  async run(ctx) {
    const [verb, ...args] = ctx.positionals;
    switch (verb) {
      case "status": {
        const id = oneRun(args, verb);
        await using session = await ctx.session("boxcar-workflow");
        const run = await session.client.getRun(id);
        ctx.print(ctx.values.json ? json(run) : describeRun(run));
        return ExitCode.ok;
      }
      case "events": {
        const id = oneRun(args, verb);
        await using session = await ctx.session("boxcar-workflow");
        const run = await session.client.getRun(id); // a clear not_found for a wrong id
        await printRunEvents(ctx, session.client, run, ctx.values.follow as boolean, ctx.print);
        return ExitCode.ok;
      }
      case "cancel": {
        const id = oneRun(args, verb);
        await using session = await ctx.session("boxcar-workflow");
        const run = await session.client.cancelRun(id);
        ctx.print(ctx.values.json ? json(run) : `${run.id} cancelled`);
        return ExitCode.ok;
      }
      case "approve":
      case "reject": {
        const [id, step, ...rest] = args;
        if (!id || !step || rest.length > 0) throw new UsageError(`workflow ${verb} needs a RUN and a STEP\n\nusage: ${usage}`);
        const comment = ctx.values.comment as string | undefined;
        await using session = await ctx.session("boxcar-workflow");
        const run = await session.client.decideStep(id, step, verb, comment);
        ctx.print(ctx.values.json ? json(run) : `${run.id}: step ${step} ${verb === "approve" ? "approved" : "rejected"}`);
        return ExitCode.ok;
      }
      case "signal": {
        const [id, name, ...rest] = args;
        if (!id || !name || rest.length > 0) throw new UsageError(`workflow signal needs a RUN and a signal NAME\n\nusage: ${usage}`);
        const payload = jsonPayload(ctx.values);
        await using session = await ctx.session("boxcar-workflow");
        const reply = await session.client.signalRun(id, name, payload);
        if (ctx.values.json) ctx.print(json(reply));
        else {
          for (const d of reply.delivered)
            ctx.print(`${d.jobId}: signal ${name} ${d.kept ? "kept until it starts, for" : "written to"} ${d.file}`);
          for (const m of reply.missed) ctx.print(`${m.jobId}: not reached: ${m.error.message}`);
        }
        return reply.delivered.length > 0 ? ExitCode.ok : ExitCode.jobFailed;
      }
      case "ls": {
        if (args.length > 0) throw new UsageError(`workflow ls takes no arguments\n\nusage: ${usage}`);
        const state = ctx.values.state as string | undefined;
        if (state !== undefined && !RunState.safeParse(state).success) {
          throw new UsageError(`--state must be one of ${RunState.options.join(", ")}, got ${state}`);
        }
        const limit = ctx.values.limit === undefined ? undefined : Number(ctx.values.limit);
        if (limit !== undefined && !(Number.isInteger(limit) && limit > 0 && limit <= 1000))
          throw new UsageError("--limit must be a whole number from 1 to 1000");
        await using session = await ctx.session("boxcar-workflow");
        const { runs, next } = await session.client.listRunsPage({
          ...(state ? { state: state as RunState } : {}),
          ...(ctx.values.workflow ? { workflow: ctx.values.workflow as string } : {}),
          // Only the runs waiting for this caller's approval.
          ...(ctx.values.awaiting ? { awaiting: true as const } : {}),
          ...(limit ? { limit } : {}),
          after: (ctx.values.after as string | undefined) ?? "",
        });
        // How to get the next page, on stderr: stdout stays the runs (a JSON array with --json).
        if (next) {
          const filters = ["state", "workflow", "limit"].flatMap((f) => (ctx.values[f] === undefined ? [] : [`--${f} ${ctx.values[f]}`]));
          if (ctx.values.awaiting) filters.push("--awaiting");
          ctx.io.stderr.write(`more: boxcar workflow ls ${[...filters, `--after '${next}'`].join(" ")}\n`);
        }
        if (ctx.values.json) {
          ctx.print(json(runs));
          return ExitCode.ok;
        }
        ctx.print(
          table(
            ["RUN", "WORKFLOW", "STATE", "STEPS", "CREATED", "RAN"],
            runs.map((r) => {
              const steps = Object.values(r.steps);
              const done = steps.filter((s) => s.state === "succeeded" || s.state === "skipped").length;
              return [r.id, r.workflow.name, r.state, `${done}/${steps.length}`, ago(r.createdAt), duration(r.createdAt, r.finishedAt)];
            }),
          ),
        );
        return ExitCode.ok;
      }
      default:
        throw new UsageError(`${verb ? `unknown workflow command ${verb}` : "missing workflow command"}\n\nusage: ${usage}`);
    }
  },
};
