import { z } from "zod";
import { PROTOCOL_VERSION } from "./agent.js";
import { ErrorInfo } from "./errors.js";
import { JobSpec } from "./job.js";
import { TOKEN_PATTERN } from "./names.js";
import { durationMs } from "./units.js";

export const ScheduleName = z.string().regex(TOKEN_PATTERN, "a schedule name is 1-64 letters, digits, '-' or '_'");

function isTimeZone(zone: string): boolean {
  try {
    new Intl.DateTimeFormat("en", { timeZone: zone });
    return true;
  } catch {
    return false;
  }
}

/** Job spec fields a schedule's job cannot have: each tick is its own submission, now, outside any session. */
const NOT_SCHEDULED = ["idempotencyKey", "delay", "runAt", "session"] as const;

/** A schedule as its owner writes it (docs/flow-control.md#schedules). */
export const ScheduleDefinition = z
  .strictObject({
    name: ScheduleName,
    cron: z
      .string()
      .min(1)
      .max(256)
      .describe(
        "when it fires: 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first; names (mon, jan) and @daily-style nicknames too",
      ),
    timezone: z
      .string()
      .max(64)
      .refine(isTimeZone, "an IANA time zone, such as Europe/Paris or UTC")
      .default("UTC")
      .describe("the time zone the cron fields are read in"),
    job: JobSpec.describe("the job each tick submits, as its owner: a job spec without idempotencyKey, delay, runAt, session or files"),
    overlap: z
      .enum(["skip", "queue-one", "allow"])
      .default("skip")
      .describe(
        "a tick while the last tick's job has not ended: `skip` it, `queue-one` (it runs when that job ends; one at most waits), or `allow` it to run beside",
      ),
    catchUp: z
      .enum(["none", "last", "all"])
      .default("last")
      .describe(
        "ticks missed while no dispatcher ran (or the schedule's were late): fire `none`, the `last`, or `all` of them within `catchUpWindow`",
      ),
    catchUpWindow: durationMs({ min: 1_000, max: 30 * 86_400_000 })
      .default(86_400_000)
      .describe("how far back `all` fires missed ticks (at most 1 000 of them)"),
  })
  .superRefine((schedule, ctx) => {
    for (const field of NOT_SCHEDULED) {
      if (schedule.job[field] !== undefined)
        ctx.addIssue({ code: "custom", path: ["job", field], message: "a schedule's job cannot have it" });
    }
    // Input objects are their uploader's and go with the first job's retention: put the input in `input`.
    if (schedule.job.files.length > 0)
      ctx.addIssue({ code: "custom", path: ["job", "files"], message: "a schedule's job takes no input files" });
  });
export type ScheduleDefinition = z.infer<typeof ScheduleDefinition>;
export type ScheduleDefinitionInput = z.input<typeof ScheduleDefinition>;

/** What became of a schedule's ticks so far. */
export const ScheduleState = z.strictObject({
  tick: z.iso.datetime().optional().describe("the last tick dealt with"),
  action: z.enum(["fired", "skipped", "queued", "missed"]).optional().describe("what was done at it"),
  jobId: z.string().optional().describe("the job of the last tick that fired, once it is admitted"),
  jobTick: z.iso.datetime().optional().describe("the tick that job was fired for"),
  pending: z.iso.datetime().optional().describe("`queue-one`: a tick that fires when the last job ends"),
  firing: z.iso
    .datetime()
    .optional()
    .describe("a tick whose job is being admitted (a dispatcher that died meanwhile leaves it to the next)"),
  fired: z.number().int().nonnegative().default(0),
  skipped: z.number().int().nonnegative().default(0),
  missed: z.number().int().nonnegative().default(0),
  lastError: ErrorInfo.optional().describe("why its last tick's job was refused; a refusal that would recur every tick pauses it"),
});
export type ScheduleState = z.infer<typeof ScheduleState>;

/** A schedule as stored in the schedules bucket (key `<owner>.<name>`), and as the API returns it. */
export const ScheduleRecord = z.looseObject({
  v: z.literal(PROTOCOL_VERSION),
  definition: ScheduleDefinition,
  owner: z.string(),
  role: z.string().optional().describe("its owner's role when it made it: its jobs are admitted under that role's quota"),
  createdAt: z.iso.datetime().describe("ticks are counted from here; its jobs' idempotency keys carry it"),
  paused: z.boolean().default(false),
  /** Set on a resume: ticks before it are not caught up. */
  resumedAt: z.iso.datetime().optional(),
  state: ScheduleState,
  next: z.iso.datetime().optional().describe("in API replies: when it fires next (absent while paused)"),
});
export type ScheduleRecord = z.infer<typeof ScheduleRecord>;

/** Names a schedule: the caller's own, or (an admin's request) another user's. */
export const ScheduleRef = z.strictObject({
  name: ScheduleName,
  owner: z.string().regex(TOKEN_PATTERN, "a user name").optional().describe("an admin may name another user's schedule"),
});
export const ScheduleReply = z.strictObject({ schedule: ScheduleRecord });
export const ListSchedulesReply = z.strictObject({ schedules: z.array(ScheduleRecord) });
