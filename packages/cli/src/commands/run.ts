import { BoxcarError, type ErrorInfo, locateYamlPath, parseWorkflowFile, toErrorInfo } from "@boxcar/protocol";
import type { Command, Values } from "../command.js";
import type { CommandContext } from "../context.js";
import { ExitCode } from "../exit-codes.js";
import { exitCodeFor } from "../failure.js";
import { jsonInput, readText } from "../json-input.js";
import { json } from "../output.js";
import { UsageError } from "../usage-error.js";
import { describeRun, exitForRun, printRunEvents } from "./workflow.js";

const usage =
  "boxcar run WORKFLOW.yaml [--input JSON | --input-file FILE] [--idempotency-key KEY] [--label KEY=VALUE]... [--wait] [--follow]";

/** `--label k=v`, repeated (a run's labels, and a scheduled job's). */
export function runLabels(specs: readonly string[]): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const spec of specs) {
    const eq = spec.indexOf("=");
    if (eq < 1) throw new UsageError(`--label ${spec}: write KEY=VALUE`);
    const [key, value] = [spec.slice(0, eq), spec.slice(eq + 1)];
    if (key.length > 64 || value.length > 256) throw new UsageError(`--label ${spec}: a key is at most 64 characters, a value 256`);
    labels[key] = value;
  }
  return labels;
}

/** An issue the dispatcher reported in the workflow, placed at its line in the file. */
interface LocatedIssue {
  path: string;
  message: string;
  line?: number;
  column?: number;
}

/**
 * Places the issues of a refused start that concern the workflow (`workflow.steps[1].agent`) at
 * their line in the file, as file errors are.
 */
function locateIssues(error: ErrorInfo, text: string): LocatedIssue[] {
  return (error.issues ?? []).map((issue) => {
    const match = /^workflow(?:\.|(?=\[))(.*)$/.exec(issue.path);
    const at = match ? locateYamlPath(text, match[1] as string) : undefined;
    return { path: match ? (match[1] as string) : issue.path, message: issue.message, ...(at ?? {}) };
  });
}

function reportRefusal(ctx: CommandContext<Values>, err: unknown, file: string, text: string): number {
  const info = toErrorInfo(err);
  const located = locateIssues(info, text);
  if (ctx.values.json) ctx.print(JSON.stringify({ error: { ...info, ...(located.length > 0 ? { issues: located } : {}) } }));
  ctx.io.stderr.write(`boxcar run: ${info.code}: ${info.message}\n`);
  for (const issue of located) {
    const where = issue.line !== undefined ? `${file}:${issue.line}:${issue.column}: ` : "  - ";
    ctx.io.stderr.write(`${where}${issue.path || "(body)"}: ${issue.message}\n`);
  }
  return exitCodeFor(err);
}

export const run: Command = {
  usage,
  maxArgs: 1,
  options: {
    input: { type: "string" },
    "input-file": { type: "string" },
    "idempotency-key": { type: "string" },
    label: { type: "string", multiple: true, default: [] },
    wait: { type: "boolean", default: false },
    follow: { type: "boolean", short: "f", default: false },
  },
  async run(ctx) {
    const [file] = ctx.positionals;
    if (!file) throw new UsageError(`expected one WORKFLOW file\n\nusage: ${usage}`);
    const text = await readText(file, "workflow file");
    // A bad file fails here with file:line:col, before anything is sent.
    const definition = parseWorkflowFile(text, file);
    const input = (await jsonInput(ctx.values)) ?? null;
    const labels = runLabels(ctx.values.label as string[]);
    const key = ctx.values["idempotency-key"] as string | undefined;

    await using session = await ctx.session("boxcar-run");
    const { client } = session;
    let started: Awaited<ReturnType<typeof client.startRun>>;
    try {
      started = await client.startRun({ workflow: definition, input: input as never, labels, ...(key ? { idempotencyKey: key } : {}) });
    } catch (err) {
      if (err instanceof BoxcarError && exitCodeFor(err) === ExitCode.refused) return reportRefusal(ctx, err, file, text);
      throw err;
    }
    const { run, duplicate } = started;
    const note = duplicate ? " (existing run for this idempotency key)" : "";
    if (!ctx.values.wait && !ctx.values.follow) {
      ctx.print(ctx.values.json ? json({ run, duplicate }) : `${run.id}${note}`);
      return ExitCode.ok;
    }
    if (!ctx.values.json) ctx.io.stderr.write(`started run ${run.id} of workflow ${run.workflow.name}${note}\n`);
    if (ctx.values.follow) await printRunEvents(ctx, client, run, true, (line) => ctx.io.stderr.write(`${line}\n`));
    const final = await client.waitForRun(run.id, ctx.io.signal);
    ctx.print(ctx.values.json ? json(final) : `\n${describeRun(final)}`);
    return exitForRun(final);
  },
};
