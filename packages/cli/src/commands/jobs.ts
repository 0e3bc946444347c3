import { stat } from "node:fs/promises";
import { basename, resolve } from "node:path";
import type { BoxcarClient, LocalInputFile } from "@boxcar/client";
import { type BoxcarEvent, type JobRecord, type JobSpecInput, JobState, type ModelCall, Priority } from "@boxcar/protocol";
import type { Command, Values } from "../command.js";
import type { OptionsConfig } from "../command-line.js";
import type { CommandContext } from "../context.js";
import { ExitCode } from "../exit-codes.js";
import { jsonInput, jsonPayload } from "../json-input.js";
import { ago, describeEvent, describeJob, json, stateOf, table } from "../output.js";
import { UsageError } from "../usage-error.js";

/**
 * 0 when the job (a chain's last) succeeded and did not end its chain by a refused handoff: an
 * agent that asked to hand on and was refused did not get its work done.
 */
const exitFor = (job: JobRecord): number => (job.state === "succeeded" && !job.handoff?.error ? ExitCode.ok : ExitCode.jobFailed);

/** A job's place in a handoff chain (or workflow run) and what became of its handoff request, as lines. */
function describeChain(job: JobRecord): string[] {
  const lines: string[] = [];
  const { chain } = job;
  if (chain) {
    const where = chain.run ? `, run ${chain.run} step ${chain.step}${chain.index !== undefined ? `[${chain.index}]` : ""}` : "";
    lines.push(`chain     root ${chain.root}, depth ${chain.depth}${chain.parent ? `, after ${chain.parent}` : ""}${where}`);
    if (chain.history.length > 0) lines.push(`          ${[...chain.history.map((h) => h.agent), job.agent].join(" → ")}`);
  }
  const asked = job.result?.handoff;
  if (job.handoff?.jobId) lines.push(`handoff   handed off to ${job.handoff.to} as job ${job.handoff.jobId}`);
  else if (job.handoff?.error) lines.push(`handoff   to ${job.handoff.to} refused: ${job.handoff.error.message}`);
  else if (asked && job.state === "succeeded") lines.push(`handoff   to ${asked.to} asked for, not yet decided`);
  else if (asked) lines.push(`handoff   to ${asked.to} not made: the job ended ${job.state}`);
  return lines;
}

/** describeJob with the chain lines after the job's own. */
const describeJobInChain = (job: JobRecord): string => [describeJob(job), ...describeChain(job)].join("\n");

function one(ctx: CommandContext<Values>, what: string, usage: string): string {
  const [value, ...rest] = ctx.positionals;
  if (!value || rest.length > 0) throw new UsageError(`expected one ${what}\n\nusage: ${usage}`);
  return value;
}

/** `--input JSON`, `--input-file FILE` or `--prompt TEXT` (as `{"prompt": TEXT}`); null without any. */
async function parseInput(values: Values): Promise<unknown> {
  const prompt = values.prompt as string | undefined;
  const input = await jsonInput(values);
  if (input !== undefined && prompt !== undefined) throw new UsageError("give --input (or --input-file) or --prompt, not both");
  if (prompt !== undefined) return { prompt };
  return input ?? null;
}

/** The flags of a job spec that `boxcar submit` and `boxcar schedule create` share. */
export const jobSpecOptions = {
  input: { type: "string" },
  "input-file": { type: "string" },
  prompt: { type: "string" },
  timeout: { type: "string" },
  pool: { type: "string" },
  priority: { type: "string" },
} as const satisfies OptionsConfig;

/**
 * The job spec fields `jobSpecOptions` give: the input (`--input`, `--input-file` or `--prompt`;
 * null without any), `--timeout`, `--pool` and `--priority` (checked here; the others by the dispatcher).
 */
export async function jobSpecFromFlags(values: Values): Promise<Pick<JobSpecInput, "input" | "timeout" | "pool" | "priority">> {
  const input = await parseInput(values);
  const priority = values.priority as string | undefined;
  if (priority !== undefined && !Priority.safeParse(priority).success) {
    throw new UsageError(`--priority must be one of ${Priority.options.join(", ")}, got ${priority}`);
  }
  return {
    input: input as never,
    ...(values.timeout ? { timeout: values.timeout as string } : {}),
    ...(values.pool ? { pool: values.pool as string } : {}),
    ...(priority ? { priority: priority as Priority } : {}),
  };
}

/** `--file PATH` puts PATH's file at its base name in the workspace; `--file DEST=PATH` at DEST. */
async function localFiles(specs: string[]): Promise<LocalInputFile[]> {
  const files: LocalInputFile[] = [];
  for (const spec of specs) {
    const eq = spec.indexOf("=");
    const [path, local] = eq > 0 ? [spec.slice(0, eq), spec.slice(eq + 1)] : [basename(spec), spec];
    const localPath = resolve(local);
    const info = await stat(localPath).catch(() => undefined);
    if (!info?.isFile()) throw new UsageError(`--file ${spec}: ${local} is not a readable file`);
    files.push({ localPath, path });
  }
  return files;
}

/**
 * Streams a job's events and output to the terminal until it ends, and then those of the jobs it
 * hands off to, one after the other; returns the record of the chain's last job.
 */
async function follow(ctx: CommandContext<Values>, client: BoxcarClient, jobId: string): Promise<JobRecord> {
  const followLogs = async (id: string) => {
    for await (const chunk of client.logs(id, { follow: true, signal: ctx.io.signal })) {
      (chunk.stream === "stdout" ? ctx.io.stdout : ctx.io.stderr).write(chunk.data);
    }
  };
  // Each job's output once the one before it has ended, so the chain's output stays in order.
  let logs = followLogs(jobId);
  const describe = describeChainEvent();
  for await (const event of client.events(jobId, { chain: true, follow: true, signal: ctx.io.signal })) {
    ctx.io.stderr.write(`${ctx.values.json ? JSON.stringify(event) : describe(event)}\n`);
    const next = event.kind === "job" && event.type === "handoff" ? event.next : undefined;
    if (next) logs = logs.then(() => followLogs(next));
  }
  await logs;
  return client.waitForChain(jobId, ctx.io.signal);
}

/**
 * `describeEvent` for the events of a handoff chain: each line says, after its time, which job
 * of the chain it is about, as `<agent>#<handoffs before it>` (`writer#0`, `reviewer#1`, ...).
 */
function describeChainEvent(): (event: BoxcarEvent) => string {
  const tags = new Map<string, string>();
  return (event) => {
    const line = describeEvent(event);
    if (event.kind === "worker" || event.kind === "session") return line;
    if (event.kind === "job" && !tags.has(event.jobId)) tags.set(event.jobId, `${event.agent}#${tags.size}`);
    if (event.kind === "job" && event.type === "handoff" && event.next && event.to) tags.set(event.next, `${event.to}#${tags.size}`);
    const time = event.at.slice(11, 23);
    // describeEvent starts with the time and two spaces: the tag goes after them.
    const tag = (event.jobId && tags.get(event.jobId)) || "";
    return `${time}  ${tag.padEnd(TAG_WIDTH)}  ${line.slice(time.length + 2)}`;
  };
}
const TAG_WIDTH = 14;

/** How a chain ended, when it went past its first job or its last handoff was refused. */
function chainEnding(first: string, last: JobRecord): string | undefined {
  const refused = last.handoff?.error ? `its handoff to ${last.handoff.to} was refused: ${last.handoff.error.message}` : undefined;
  if (last.id === first) return refused && `job ${last.id} succeeded, but ${refused}`;
  return `the chain ended with job ${last.id} (agent ${last.agent}, ${last.chain?.depth ?? 0} handoffs after ${first})${refused ? `; ${refused}` : ""}`;
}

/** `--max-hops N` and `--max-visits N`: the limits of the chain the job starts. */
function chainLimits(values: Values): { maxHops?: number; maxVisits?: number } | undefined {
  const limits: { maxHops?: number; maxVisits?: number } = {};
  for (const [flag, key] of [
    ["max-hops", "maxHops"],
    ["max-visits", "maxVisits"],
  ] as const) {
    const raw = values[flag] as string | undefined;
    if (raw === undefined) continue;
    if (!/^\d+$/.test(raw)) throw new UsageError(`--${flag} must be a whole number, got ${raw}`);
    limits[key] = Number(raw);
  }
  return Object.keys(limits).length > 0 ? limits : undefined;
}

export const submit: Command = {
  usage:
    "boxcar submit AGENT [--input JSON | --input-file FILE | --prompt TEXT] [--file [DEST=]PATH]... [--wait] [--follow] [--idempotency-key KEY] [--timeout 10m] [--deadline 1h] [--pool POOL] [--priority high|normal|low] [--session SESSION] [--delay 10m | --run-at TIME] [--max-hops N] [--max-visits N]",
  maxArgs: 1,
  options: {
    ...jobSpecOptions,
    file: { type: "string", multiple: true, default: [] },
    wait: { type: "boolean", default: false },
    follow: { type: "boolean", short: "f", default: false },
    "idempotency-key": { type: "string" },
    deadline: { type: "string" },
    session: { type: "string" },
    delay: { type: "string" },
    "run-at": { type: "string" },
    "max-hops": { type: "string" },
    "max-visits": { type: "string" },
  },
  async run(ctx) {
    const agent = one(ctx, "AGENT", this.usage);
    const fromFlags = await jobSpecFromFlags(ctx.values);
    const limits = chainLimits(ctx.values);
    const upload = await localFiles(ctx.values.file as string[]);
    await using session = await ctx.session("boxcar-submit");
    const { client } = session;
    const { job, duplicate } = await client.submit(
      {
        agent,
        ...fromFlags,
        ...(ctx.values["idempotency-key"] ? { idempotencyKey: ctx.values["idempotency-key"] as string } : {}),
        ...(ctx.values.deadline ? { deadline: ctx.values.deadline as string } : {}),
        ...(ctx.values.session ? { session: ctx.values.session as string } : {}),
        ...(ctx.values.delay ? { delay: ctx.values.delay as string } : {}),
        ...(ctx.values["run-at"] ? { runAt: ctx.values["run-at"] as string } : {}),
        ...(limits ? { chainLimits: limits } : {}),
      },
      { upload },
    );
    if (!ctx.values.wait && !ctx.values.follow) {
      ctx.print(ctx.values.json ? json({ job, duplicate }) : `${job.id}${duplicate ? " (existing job for this idempotency key)" : ""}`);
      return ExitCode.ok;
    }
    if (!ctx.values.json) ctx.io.stderr.write(`submitted ${job.id}${duplicate ? " (existing job for this idempotency key)" : ""}\n`);
    // A job that hands off is done when its chain is: wait for the chain's last job.
    const final = ctx.values.follow ? await follow(ctx, client, job.id) : await client.waitForChain(job.id, ctx.io.signal);
    const ending = chainEnding(job.id, final);
    if (ending && !ctx.values.json) ctx.io.stderr.write(`${ending}\n`);
    ctx.print(ctx.values.json ? json(final) : `\n${describeJobInChain(final)}`);
    return exitFor(final);
  },
};

export const status: Command = {
  usage: "boxcar status JOB [--wait]",
  maxArgs: 1,
  options: { wait: { type: "boolean", default: false } },
  async run(ctx) {
    const id = one(ctx, "JOB", this.usage);
    await using session = await ctx.session("boxcar-status");
    // Waiting rides out dispatchers that do not answer from its first read on.
    const job = ctx.values.wait ? await session.client.waitForJob(id, ctx.io.signal) : await session.client.getJob(id);
    if (ctx.values.json) {
      ctx.print(json(job));
      return ctx.values.wait ? exitFor(job) : ExitCode.ok;
    }
    ctx.print(describeJobInChain(job));
    // The calls its agent made through its worker's model gateway, one line each.
    if (job.usage && job.usage.calls > 0) {
      const calls: ModelCall[] = [];
      for await (const e of session.client.events(id, { chain: false, signal: ctx.io.signal })) {
        if (e.kind === "job" && e.type === "model_call" && e.call) calls.push(e.call);
      }
      if (calls.length > 0) {
        ctx.print(`\nmodel calls (${calls.length}):`);
        ctx.print(
          table(
            ["PROVIDER", "MODEL", "STATUS", "TOKENS IN", "OUT", "MS", "STREAM"],
            calls.map((c) => [
              c.provider,
              c.model ?? "-",
              String(c.status),
              String(c.tokensIn),
              String(c.tokensOut),
              String(c.latencyMs),
              c.stream ? "yes" : "no",
            ]),
          ),
        );
      }
    }
    return ctx.values.wait ? exitFor(job) : ExitCode.ok;
  },
};

export const logs: Command = {
  usage: "boxcar logs JOB [--follow]",
  maxArgs: 1,
  options: { follow: { type: "boolean", short: "f", default: false } },
  async run(ctx) {
    const id = one(ctx, "JOB", this.usage);
    await using session = await ctx.session("boxcar-logs");
    await session.client.getJob(id); // a clear not_found for a wrong id
    for await (const chunk of session.client.logs(id, { follow: ctx.values.follow as boolean, signal: ctx.io.signal })) {
      if (ctx.values.json) ctx.print(JSON.stringify({ stream: chunk.stream, text: new TextDecoder().decode(chunk.data) }));
      else (chunk.stream === "stdout" ? ctx.io.stdout : ctx.io.stderr).write(chunk.data);
    }
    return ExitCode.ok;
  },
};

export const events: Command = {
  usage: "boxcar events JOB [--follow] [--no-chain]",
  maxArgs: 1,
  options: { follow: { type: "boolean", short: "f", default: false }, "no-chain": { type: "boolean", default: false } },
  async run(ctx) {
    const id = one(ctx, "JOB", this.usage);
    await using session = await ctx.session("boxcar-events");
    await session.client.getJob(id);
    const opts = { follow: ctx.values.follow as boolean, chain: !ctx.values["no-chain"], signal: ctx.io.signal };
    const describe = opts.chain ? describeChainEvent() : describeEvent;
    for await (const event of session.client.events(id, opts)) {
      ctx.print(ctx.values.json ? JSON.stringify(event) : describe(event));
    }
    return ExitCode.ok;
  },
};

export const artifacts: Command = {
  usage: "boxcar artifacts JOB [--out DIR]",
  maxArgs: 1,
  options: { out: { type: "string" } },
  async run(ctx) {
    const id = one(ctx, "JOB", this.usage);
    await using session = await ctx.session("boxcar-artifacts");
    if (ctx.values.out) {
      const out = await stat(ctx.values.out as string).catch(() => undefined);
      if (out && !out.isDirectory()) throw new UsageError(`--out ${ctx.values.out}: not a folder`);
      const written = await session.client.downloadArtifacts(id, ctx.values.out as string);
      ctx.print(ctx.values.json ? json(written) : written.join("\n") || "(no artifacts)");
      return ExitCode.ok;
    }
    const job = await session.client.getJob(id);
    if (ctx.values.json) ctx.print(json(job.artifacts));
    else
      ctx.print(
        table(
          ["PATH", "SIZE", "SHA256"],
          job.artifacts.map((a) => [a.path, String(a.size), a.sha256.slice(0, 16)]),
        ),
      );
    return ExitCode.ok;
  },
};

export const cancel: Command = {
  usage: "boxcar cancel JOB",
  maxArgs: 1,
  options: {},
  async run(ctx) {
    const id = one(ctx, "JOB", this.usage);
    await using session = await ctx.session("boxcar-cancel");
    const job = await session.client.cancelJob(id);
    ctx.print(
      ctx.values.json ? json(job) : job.state === "cancelled" ? `${id} cancelled` : `${id} cancel requested (running on ${job.workerId})`,
    );
    return ExitCode.ok;
  },
};

export const signal: Command = {
  usage: "boxcar signal JOB NAME [--payload JSON]",
  maxArgs: 2,
  options: { payload: { type: "string" } },
  async run(ctx) {
    const [id, name] = ctx.positionals;
    if (!id || !name) throw new UsageError(`give a JOB and a signal NAME\n\nusage: ${this.usage}`);
    const payload = jsonPayload(ctx.values);
    await using session = await ctx.session("boxcar-signal");
    const reply = await session.client.signalJob(id, name, payload);
    ctx.print(
      ctx.values.json ? json(reply) : `${id}: signal ${name} ${reply.kept ? "kept until it starts, for" : "written to"} ${reply.file}`,
    );
    return ExitCode.ok;
  },
};

export const jobs: Command = {
  usage: "boxcar jobs [--state STATE] [--agent AGENT] [--pool POOL] [--limit N] [--after JOB] | --counts [--agent AGENT]",
  maxArgs: 0,
  options: {
    state: { type: "string" },
    agent: { type: "string" },
    pool: { type: "string" },
    limit: { type: "string" },
    after: { type: "string" },
    counts: { type: "boolean" },
  },
  async run(ctx) {
    if (ctx.values.counts) return countJobs(ctx);
    const state = ctx.values.state as string | undefined;
    if (state !== undefined && !JobState.safeParse(state).success) {
      throw new UsageError(`--state must be one of ${JobState.options.join(", ")}, got ${state}`);
    }
    const limit = ctx.values.limit === undefined ? undefined : Number(ctx.values.limit);
    if (limit !== undefined && !(Number.isInteger(limit) && limit > 0 && limit <= 1000))
      throw new UsageError("--limit must be a whole number from 1 to 1000");
    await using session = await ctx.session("boxcar-jobs");
    const page = await session.client.listJobs({
      ...(state ? { state: state as JobState } : {}),
      ...(ctx.values.agent ? { agent: ctx.values.agent as string } : {}),
      ...(ctx.values.pool ? { pool: ctx.values.pool as string } : {}),
      ...(limit ? { limit } : {}),
      ...(ctx.values.after ? { after: ctx.values.after as string } : {}),
    });
    if (ctx.values.json) {
      ctx.print(json(page));
      return ExitCode.ok;
    }
    ctx.print(
      table(
        ["JOB", "AGENT", "STATE", "PRIORITY", "ATTEMPT", "CREATED", "WORKER"],
        page.jobs.map((j) => [j.id, j.agent, stateOf(j), j.priority ?? "normal", String(j.attempt), ago(j.createdAt), j.workerId ?? "-"]),
      ),
    );
    if (page.next) {
      const filters = ["state", "agent", "pool", "limit"].flatMap((f) => (ctx.values[f] === undefined ? [] : [`--${f} ${ctx.values[f]}`]));
      ctx.print(`more: boxcar jobs ${[...filters, `--after ${page.next}`].join(" ")}`);
    }
    return ExitCode.ok;
  },
};

/** `boxcar jobs --counts`: how many jobs are in each state (those in none left out, unless --json). */
async function countJobs(ctx: CommandContext<Values>): Promise<number> {
  const other = ["state", "pool", "limit", "after"].find((f) => ctx.values[f] !== undefined);
  if (other) throw new UsageError(`--counts takes only --agent, not --${other}`);
  await using session = await ctx.session("boxcar-jobs");
  const reply = await session.client.countJobs(ctx.values.agent === undefined ? {} : { agent: ctx.values.agent as string });
  if (ctx.values.json) ctx.print(json(reply));
  else {
    const rows = Object.entries(reply.counts).filter(([, n]) => (n as number) > 0);
    ctx.print(table(["STATE", "JOBS"], [...rows.map(([state, n]) => [state, String(n)]), ["total", String(reply.total)]]));
  }
  return ExitCode.ok;
}

export const retry: Command = {
  usage: "boxcar retry JOB | --agent AGENT   (a job that is dead, failed, timed out or cancelled; --agent: every dead job of the agent)",
  maxArgs: 1,
  options: { agent: { type: "string" } },
  async run(ctx) {
    const agent = ctx.values.agent as string | undefined;
    if ((agent === undefined) === (ctx.positionals.length === 0))
      throw new UsageError(`give a JOB or --agent AGENT\n\nusage: ${this.usage}`);
    await using session = await ctx.session("boxcar-retry");
    const { client } = session;
    const ids = agent === undefined ? [ctx.positionals[0] as string] : await deadJobs(client, agent);
    const retried = [];
    for (const id of ids) retried.push(await client.retryJob(id));
    if (ctx.values.json) ctx.print(json(retried));
    else ctx.print(retried.length > 0 ? retried.map((j) => `${j.id} queued again`).join("\n") : `no dead jobs of agent ${agent}`);
    return ExitCode.ok;
  },
};

export const rerun: Command = {
  usage: "boxcar rerun JOB [--input JSON | --input-file FILE | --prompt TEXT] [--wait]",
  maxArgs: 1,
  options: { input: { type: "string" }, "input-file": { type: "string" }, prompt: { type: "string" }, wait: { type: "boolean" } },
  async run(ctx) {
    const id = ctx.positionals[0];
    if (id === undefined) throw new UsageError(`give the JOB to run again\n\nusage: ${this.usage}`);
    const edited = ctx.values.input !== undefined || ctx.values["input-file"] !== undefined || ctx.values.prompt !== undefined;
    const input = edited ? await parseInput(ctx.values) : undefined;
    await using session = await ctx.session("boxcar-rerun");
    const job = await session.client.rerunJob(id, input);
    const final = ctx.values.wait ? await session.client.waitForJob(job.id) : job;
    if (ctx.values.json) ctx.print(json(final));
    else ctx.print(ctx.values.wait ? `${final.id} (a re-run of ${id}) ${final.state}` : `${job.id} submitted (a re-run of ${id})`);
    return ctx.values.wait && final.state !== "succeeded" ? ExitCode.jobFailed : ExitCode.ok;
  },
};

async function deadJobs(client: BoxcarClient, agent: string): Promise<string[]> {
  const ids: string[] = [];
  let after: string | undefined;
  do {
    const page = await client.listJobs({ state: "dead", agent, limit: 1000, ...(after ? { after } : {}) });
    ids.push(...page.jobs.map((j) => j.id));
    after = page.next;
  } while (after);
  return ids;
}
