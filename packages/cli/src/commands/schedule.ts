import {
  formatPath,
  parseYamlFile,
  ScheduleDefinition,
  type ScheduleDefinitionInput,
  type ScheduleRecord,
  ScheduleRef,
} from "@boxcar/protocol";
import type { Command, Values } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { readText } from "../json-input.js";
import { describeSchedule, json, lastTick, table } from "../output.js";
import { UsageError } from "../usage-error.js";
import { jobSpecFromFlags, jobSpecOptions } from "./jobs.js";
import { runLabels } from "./run.js";

const usage = `boxcar schedule create NAME --agent AGENT --cron "EXPR" [--timezone TZ] [--input JSON | --input-file FILE | --prompt TEXT] [--label KEY=VALUE]... [--priority high|normal|low] [--pool POOL] [--timeout 10m] [--overlap skip|queue-one|allow] [--catch-up none|last|all] [--catch-up-window 1d]
       boxcar schedule create -f FILE
       boxcar schedule update NAME ... | update -f FILE      (the whole definition, as create's; its history stays)
       boxcar schedule list
       boxcar schedule get NAME [--owner USER]
       boxcar schedule pause NAME | resume NAME | delete NAME [--owner USER]`;

/** The flags that write a schedule's definition, with `create` and `update` only (and not with `-f FILE`). */
const DEFINITION_FLAGS = [
  "agent",
  "cron",
  "timezone",
  ...Object.keys(jobSpecOptions),
  "label",
  "overlap",
  "catch-up",
  "catch-up-window",
] as const;

/** The flag (or argument) that gives each field of a definition, to name it in errors. */
const FLAG_OF: Readonly<Record<string, string>> = {
  name: "NAME",
  cron: "--cron",
  timezone: "--timezone",
  overlap: "--overlap",
  catchUp: "--catch-up",
  catchUpWindow: "--catch-up-window",
  "job.agent": "--agent",
  "job.input": "--input",
  "job.timeout": "--timeout",
  "job.pool": "--pool",
  "job.priority": "--priority",
  "job.labels": "--label",
};

const given = (values: Values, flag: string): boolean => {
  const value = values[flag];
  return Array.isArray(value) ? value.length > 0 : value !== undefined;
};

/** `--overlap` or `--catch-up`: one of the field's options, or undefined when not given. */
function oneOf<T extends string>(values: Values, flag: string, options: readonly T[]): T | undefined {
  const value = values[flag] as string | undefined;
  if (value !== undefined && !(options as readonly string[]).includes(value)) {
    throw new UsageError(`--${flag} must be one of ${options.join(", ")}, got ${value}`);
  }
  return value as T | undefined;
}

/** The definition `create NAME --agent ... --cron ...` writes, checked before anything is sent (errors name the flag). */
async function definitionFromFlags(verb: string, name: string | undefined, values: Values): Promise<ScheduleDefinitionInput> {
  if (!name) throw new UsageError(`schedule ${verb} needs a NAME (or -f FILE)\n\nusage: ${usage}`);
  const agent = values.agent as string | undefined;
  const cron = values.cron as string | undefined;
  if (agent === undefined) throw new UsageError(`schedule ${verb} needs --agent AGENT\n\nusage: ${usage}`);
  if (cron === undefined) throw new UsageError(`schedule ${verb} needs --cron "EXPR", such as "0 3 * * *"\n\nusage: ${usage}`);
  const { shape } = ScheduleDefinition;
  const overlap = oneOf(values, "overlap", shape.overlap.unwrap().options);
  const catchUp = oneOf(values, "catch-up", shape.catchUp.unwrap().options);
  const labels = runLabels(values.label as string[]);
  const definition: ScheduleDefinitionInput = {
    name,
    cron,
    ...(values.timezone !== undefined ? { timezone: values.timezone as string } : {}),
    job: { agent, ...(await jobSpecFromFlags(values)), ...(Object.keys(labels).length > 0 ? { labels } : {}) },
    ...(overlap ? { overlap } : {}),
    ...(catchUp ? { catchUp } : {}),
    ...(values["catch-up-window"] !== undefined ? { catchUpWindow: values["catch-up-window"] as string } : {}),
  };
  const checked = ScheduleDefinition.safeParse(definition);
  if (!checked.success) {
    const problems = checked.error.issues.map((issue) => {
      const [field, sub] = issue.path.map(String);
      return `${FLAG_OF[field === "job" ? `job.${sub}` : (field ?? "")] ?? formatPath(issue.path)}: ${issue.message}`;
    });
    throw new UsageError(problems.length === 1 ? (problems[0] as string) : `invalid schedule\n${problems.map((p) => `  ${p}`).join("\n")}`);
  }
  return definition;
}

/** A whole definition from `-f FILE` (YAML or JSON); errors name the file, line and field. */
async function readScheduleFile(file: string): Promise<ScheduleDefinition> {
  return parseYamlFile(await readText(file, "schedule file"), file, ScheduleDefinition, "schedule file");
}

export const schedule: Command = {
  usage,
  maxArgs: 2,
  options: {
    ...jobSpecOptions,
    agent: { type: "string" },
    cron: { type: "string" },
    timezone: { type: "string" },
    label: { type: "string", multiple: true, default: [] },
    overlap: { type: "string" },
    "catch-up": { type: "string" },
    "catch-up-window": { type: "string" },
    file: { type: "string", short: "f" },
    owner: { type: "string" },
  },
  async run(ctx) {
    const [verb, name] = ctx.positionals;
    const file = ctx.values.file as string | undefined;
    const owner = ctx.values.owner as string | undefined;
    // Flags of another verb are mistakes, not to be dropped silently.
    if (verb === "list" || verb === "get" || verb === "pause" || verb === "resume" || verb === "delete") {
      const stray = [...DEFINITION_FLAGS, "file"].find((flag) => given(ctx.values, flag));
      if (stray) throw new UsageError(`--${stray} goes with schedule create or update\n\nusage: ${usage}`);
    }
    if (owner !== undefined && (verb === "create" || verb === "update" || verb === "list")) {
      throw new UsageError(`--owner goes with schedule get, pause, resume and delete\n\nusage: ${usage}`);
    }
    /** The schedule NAME (and `--owner`) names, checked. */
    const ref = () => {
      if (!name) throw new UsageError(`schedule ${verb} needs one NAME\n\nusage: ${usage}`);
      const checked = ScheduleRef.safeParse({ name, ...(owner !== undefined ? { owner } : {}) });
      if (!checked.success) {
        const issue = checked.error.issues[0];
        throw new UsageError(`${issue?.path[0] === "owner" ? "--owner" : "NAME"}: ${issue?.message}`);
      }
      return name;
    };
    /** The schedule as a line names it: another user's with its owner. */
    const named = (s: ScheduleRecord) => (owner !== undefined ? `${s.definition.name} of ${s.owner}` : s.definition.name);
    switch (verb) {
      case "create":
      case "update": {
        let definition: ScheduleDefinitionInput;
        if (file !== undefined) {
          const stray = DEFINITION_FLAGS.find((flag) => given(ctx.values, flag));
          if (name !== undefined || stray) {
            throw new UsageError(`-f FILE holds the whole schedule: give no ${stray ? `--${stray}` : "NAME"} with it\n\nusage: ${usage}`);
          }
          definition = await readScheduleFile(file);
        } else {
          definition = await definitionFromFlags(verb, name, ctx.values);
        }
        await using s = await ctx.session("boxcar-schedule");
        const written = verb === "create" ? await s.client.createSchedule(definition) : await s.client.updateSchedule(definition);
        ctx.print(
          ctx.values.json
            ? json(written)
            : `schedule ${written.definition.name} ${verb}d${written.next ? `; it fires next at ${written.next}` : ""}`,
        );
        return ExitCode.ok;
      }
      case "list": {
        if (name !== undefined) throw new UsageError(`schedule list takes no NAME\n\nusage: ${usage}`);
        await using s = await ctx.session("boxcar-schedule");
        const list = await s.client.listSchedules();
        ctx.print(
          ctx.values.json
            ? json(list)
            : table(
                ["NAME", "OWNER", "CRON", "TIMEZONE", "AGENT", "STATE", "NEXT", "LAST", "FIRED", "SKIPPED", "MISSED"],
                list.map((x) => [
                  x.definition.name,
                  x.owner,
                  x.definition.cron,
                  x.definition.timezone,
                  x.definition.job.agent,
                  x.paused ? "paused" : "active",
                  x.next ?? "-",
                  lastTick(x),
                  String(x.state.fired),
                  String(x.state.skipped),
                  String(x.state.missed),
                ]),
              ),
        );
        return ExitCode.ok;
      }
      case "get": {
        const which = ref();
        await using s = await ctx.session("boxcar-schedule");
        const found = await s.client.getSchedule(which, owner);
        ctx.print(ctx.values.json ? json(found) : describeSchedule(found));
        return ExitCode.ok;
      }
      case "pause": {
        const which = ref();
        await using s = await ctx.session("boxcar-schedule");
        const paused = await s.client.pauseSchedule(which, owner);
        ctx.print(ctx.values.json ? json(paused) : `schedule ${named(paused)} paused`);
        return ExitCode.ok;
      }
      case "resume": {
        const which = ref();
        await using s = await ctx.session("boxcar-schedule");
        const resumed = await s.client.resumeSchedule(which, owner);
        ctx.print(
          ctx.values.json ? json(resumed) : `schedule ${named(resumed)} resumed${resumed.next ? `; it fires next at ${resumed.next}` : ""}`,
        );
        return ExitCode.ok;
      }
      case "delete": {
        const which = ref();
        await using s = await ctx.session("boxcar-schedule");
        const deleted = await s.client.deleteSchedule(which, owner);
        ctx.print(ctx.values.json ? json(deleted) : `schedule ${named(deleted)} deleted`);
        return ExitCode.ok;
      }
      default:
        throw new UsageError(`${verb ? `unknown schedule command ${verb}` : "missing schedule command"}\n\nusage: ${usage}`);
    }
  },
};
