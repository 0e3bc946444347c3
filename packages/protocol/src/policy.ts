import { z } from "zod";
import { UserName } from "./access.js";
import { type AgentDefinition, AgentName, EnvName, MAX_TIMEOUT_MS, NetworkWish, PoolName, ResourceLimits } from "./agent.js";
import { BoxcarError, ErrorCode, type ErrorIssue } from "./errors.js";
import { ModelProvider } from "./models.js";
import { BuiltinTool } from "./prompt-agent.js";
import { SessionTemplate, SessionTemplateName } from "./session.js";
import { durationMs, sizeBytes } from "./units.js";
import { Budget, MODEL_NAME } from "./usage.js";

const DAY_MS = 24 * 3_600_000;

/** An image or template name, with `*` standing for any run of characters (`registry.example.com/agents/*`). */
const NamePattern = z.string().min(1).max(512);

/**
 * What agents may ask for. An admin sets one for the system (`boxcar policy set`: checked when
 * an agent is applied and when a job is submitted); a worker may have its own (the `policy` of
 * its config file: checked before a job runs). A field left out allows anything.
 */
export const AgentPolicy = z.strictObject({
  networks: z.array(NetworkWish).optional().describe("the network wishes agents may make: none, bridge, network names"),
  images: z.array(NamePattern).optional().describe("the container images agents may name, as patterns with *"),
  templates: z.array(NamePattern).optional().describe("the E2B templates agents may name, as patterns with *"),
  pools: z.array(PoolName).optional().describe("the pools agents may name"),
  secrets: z.array(EnvName).optional().describe("the worker variables agents may ask for"),
  trusted: z.boolean().optional().describe("false: no agent may be marked trusted (so none runs unisolated)"),
  tools: z.array(BuiltinTool).optional().describe("the built-in tools prompt agents may use (docs/harness.md#tools)"),
  mcp: z.boolean().optional().describe("false: no prompt agent may start MCP servers"),
  limits: ResourceLimits.extend({ timeout: durationMs({ min: 100, max: MAX_TIMEOUT_MS }).optional() })
    .optional()
    .describe("the most an agent may ask for"),
});
export type AgentPolicy = z.infer<typeof AgentPolicy>;
export type AgentPolicyInput = z.input<typeof AgentPolicy>;

const matches = (pattern: string, name: string): boolean =>
  new RegExp(`^${pattern.replace(/[.+?^${}()|[\]\\]/g, "\\$&").replaceAll("*", ".*")}$`).test(name);

const list = (values: readonly string[]) => (values.length === 0 ? "nothing" : values.join(", "));

/** Where `agent` asks for more than `policy` allows, one issue per field. */
export function policyViolations(agent: AgentDefinition, policy: AgentPolicy): ErrorIssue[] {
  const issues: ErrorIssue[] = [];
  const { runtime } = agent;
  const refuse = (path: string, message: string) => issues.push({ path, message });
  if (policy.networks && !policy.networks.includes(runtime.network)) {
    refuse("runtime.network", `${runtime.network} is not allowed (allowed: ${list(policy.networks)})`);
  }
  if (policy.images && runtime.image !== undefined && !policy.images.some((p) => matches(p, runtime.image as string))) {
    refuse("runtime.image", `${runtime.image} is not allowed (allowed: ${list(policy.images)})`);
  }
  if (policy.templates && runtime.template !== undefined && !policy.templates.some((p) => matches(p, runtime.template as string))) {
    refuse("runtime.template", `${runtime.template} is not allowed (allowed: ${list(policy.templates)})`);
  }
  if (policy.pools && !policy.pools.includes(agent.pool)) refuse("pool", `${agent.pool} is not allowed (allowed: ${list(policy.pools)})`);
  if (policy.secrets) {
    const allowed = policy.secrets;
    agent.secrets.forEach((s, i) => {
      if (!allowed.includes(s.from)) refuse(`secrets[${i}]`, `${s.from} is not allowed (allowed: ${list(allowed)})`);
    });
  }
  if (policy.trusted === false && agent.trusted) refuse("trusted", "no agent may be trusted");
  const prompt = agent.prompt;
  if (prompt && policy.tools) {
    const allowed = policy.tools;
    prompt.tools.forEach((tool, i) => {
      if (!allowed.includes(tool)) refuse(`prompt.tools[${i}]`, `${tool} is not allowed (allowed: ${list(allowed)})`);
    });
  }
  if (prompt && policy.mcp === false && prompt.mcp.length > 0) refuse("prompt.mcp", "no agent may start MCP servers");
  const max = policy.limits ?? {};
  for (const key of ["cpus", "memory", "pids"] as const) {
    const asked = runtime.limits[key];
    const most = max[key];
    if (asked !== undefined && most !== undefined && asked > most)
      refuse(`runtime.limits.${key}`, `${asked} is more than the ${most} allowed`);
  }
  if (max.timeout !== undefined && runtime.timeout > max.timeout) {
    refuse("runtime.timeout", `${runtime.timeout} ms is more than the ${max.timeout} ms allowed`);
  }
  return issues;
}

/** Throws `policy_denied` naming every field where `agent` asks for more than `whose` policy allows. */
export function checkAgentPolicy(agent: AgentDefinition, policy: AgentPolicy | undefined, whose: string): void {
  const issues = policy ? policyViolations(agent, policy) : [];
  if (issues.length === 0) return;
  throw new BoxcarError(
    ErrorCode.policyDenied,
    `agent ${agent.name}: ${whose} does not allow ${issues.map((i) => `${i.path}: ${i.message}`).join("; ")}`,
    { issues },
  );
}

/**
 * How many jobs one user may have waiting to start (`queued`) and running (`running`), and how
 * many bytes of theirs the store may keep (`bytes`); absent: no limit.
 */
export const Quota = z.strictObject({
  queued: z.number().int().nonnegative().optional().describe("jobs accepted or queued, not yet started"),
  running: z.number().int().nonnegative().optional().describe("jobs running"),
  bytes: sizeBytes({ min: 0, max: 1024 ** 5 })
    .optional()
    .describe(
      'bytes kept of the user\'s jobs, every job not yet deleted: their records as stored (inputs included) and their artifacts, such as "2Gi"; a new job is refused storage_quota_exceeded at or past it',
    ),
  sessions: z.number().int().nonnegative().optional().describe("sessions open at once (each holds a worker's slot)"),
  snapshots: z.number().int().nonnegative().optional().describe("snapshots of sessions kept (each holds up to 1 GiB of the store)"),
});
export type Quota = z.infer<typeof Quota>;

/** What the whole system holds queued before new submissions are refused; what is left out takes its default. */
export const QueueLimits = z.strictObject({
  jobs: z.number().int().positive().optional().describe("jobs accepted or queued, not yet started (default 100000)"),
  bytes: sizeBytes({ min: 1024 ** 2, max: 1024 ** 5 })
    .optional()
    .describe('bytes of their records, inputs included, such as "256Mi" (default 256Mi)'),
  headroom: sizeBytes({ min: 0, max: 1024 ** 5 })
    .optional()
    .describe(
      "room kept free in JetStream's store for the jobs admitted, deletions and the roles' own writes: new work is refused storage_full once less is free " +
        "(default 5% of the store, at least 1Mi and at most 1Gi; \"0\": none). The store's size is the account's JetStream limit, else what it held when JetStream last refused a write",
    ),
});
export type QueueLimits = z.infer<typeof QueueLimits>;

/** The queue limits of a system whose policy sets none. */
export const DEFAULT_QUEUE_LIMITS: Required<Pick<QueueLimits, "jobs" | "bytes">> = { jobs: 100_000, bytes: 256 * 1024 ** 2 };

const period = durationMs({ min: 1_000, max: 3_650 * DAY_MS }).optional();

/** How long ended jobs are kept: the system's periods, or one agent's. */
const RetentionPeriods = z.strictObject({
  jobs: period.describe('every ended job, counted from its end, such as "7d" or "12h" (default 7d)'),
  failed: period.describe("jobs that ended failed, timed_out or dead, in place of jobs (default: as jobs)"),
});

/**
 * How long ended jobs are kept before they are deleted with their events, output, input files
 * and artifacts; ended workflow runs are kept as long as jobs (failed runs as failed jobs).
 */
export const Retention = RetentionPeriods.extend({
  agents: z.record(AgentName, RetentionPeriods).optional().describe("an agent's jobs: each period it sets replaces the system's for them"),
});
export type Retention = z.infer<typeof Retention>;

/** How long ended jobs are kept when the policy says nothing. */
export const DEFAULT_RETENTION_MS = 7 * DAY_MS;

/** The final states whose jobs `Retention.failed` keeps (and `failed`, of a run). */
const FAILED_STATES: ReadonlySet<string> = new Set(["failed", "timed_out", "dead"]);

/**
 * How long a job of `agent` that ended in `state` is kept under `policy`: each period the agent
 * sets replaces the system's, and `failed`, where neither sets it, is `jobs` as it came out.
 * Without an agent, a workflow run's.
 */
export function retentionOf(policy: SystemPolicy, state: string, agent?: string): number {
  const own = agent === undefined ? undefined : policy.retention.agents?.[agent];
  const jobs = own?.jobs ?? policy.retention.jobs ?? DEFAULT_RETENTION_MS;
  return FAILED_STATES.has(state) ? (own?.failed ?? policy.retention.failed ?? jobs) : jobs;
}

/** An admin's policy for the whole system, kept in the policy bucket (`boxcar policy set -f FILE`). */
/** What a model's tokens cost, per million, in the currency budgets are written in. */
export const ModelPrice = z.strictObject({
  in: z.number().min(0).max(1e6).describe("per million tokens sent (the prompt)"),
  out: z.number().min(0).max(1e6).describe("per million tokens received"),
  cacheRead: z.number().min(0).max(1e6).optional().describe("per million prompt tokens read from the provider's cache (default: as `in`)"),
  cacheWrite: z.number().min(0).max(1e6).optional().describe("per million prompt tokens written to it (default: as `in`)"),
});
export type ModelPrice = z.infer<typeof ModelPrice>;

/**
 * A fleet-wide limit on model calls through the workers' gateways (docs/models.md#limits): at most
 * `requests` calls and `tokens` tokens (in and out) per window of `per`, for one provider, or one
 * of its models. Windows are fixed (the minute, hour, ... from the epoch), counted in NATS KV by
 * every gateway together. A call past it waits up to `wait` for the next window, else gets the
 * provider's own 429 with `retry-after`.
 */
export const ModelLimit = z
  .strictObject({
    provider: ModelProvider,
    model: z.string().regex(MODEL_NAME, "a model's name").optional().describe("one model of the provider; absent: all of them together"),
    requests: z.number().int().min(1).max(1e9).optional().describe("the most calls per window"),
    tokens: z.number().int().min(1).max(1e12).optional().describe("the most tokens, in and out, per window"),
    per: durationMs({ min: 1_000, max: 86_400_000 }).default(60_000).describe("the window; default 1m"),
    wait: durationMs({ min: 0, max: 600_000 })
      .default(30_000)
      .describe("how long a call past the limit waits for the next window before it is refused (429)"),
  })
  .refine((l) => l.requests !== undefined || l.tokens !== undefined, "give requests, tokens or both");
export type ModelLimit = z.infer<typeof ModelLimit>;

export const SystemPolicy = z.strictObject({
  agents: AgentPolicy.default({}).describe("what agents may ask for"),
  quotas: z
    .strictObject({
      default: Quota.default({}).describe("every user's, unless named below"),
      users: z.record(UserName, Quota).default({}).describe("a user's own, in place of the default"),
      artifacts: sizeBytes({ min: 0, max: 1024 ** 5 })
        .optional()
        .describe(
          "bytes of artifacts kept in all, every user's, such as \"50Gi\": new work (not the steps and handoffs of work admitted) is refused storage_quota_exceeded at or past it, admins' too",
        ),
    })
    .default({ default: {}, users: {} }),
  retention: Retention.default({}).describe("how long ended jobs and workflow runs are kept"),
  budgets: z
    .strictObject({
      agents: z.record(AgentName, Budget).default({}).describe("an agent's budget per day, over every user's jobs"),
      users: z.record(UserName, Budget).default({}).describe("a user's budget per day, over all its jobs"),
    })
    .default({ agents: {}, users: {} })
    .describe("what agents and users may spend in a day, from the usage their agents report (docs/flow-control.md#usage-and-budgets)"),
  pools: z
    .record(
      PoolName,
      z.strictObject({
        concurrency: z
          .number()
          .int()
          .min(1)
          .max(100_000)
          .optional()
          .describe(
            "how many of its jobs may hold a place at once, from when one is let go to the workers until it ends, whatever their agent",
          ),
      }),
    )
    .default({})
    .describe("limits per work pool (docs/flow-control.md#pool-limits)"),
  prices: z
    .record(z.string().regex(MODEL_NAME, "a model's name"), ModelPrice)
    .default({})
    .describe(
      "what a model's tokens cost, per million, in the budgets' currency: the model gateway prices each call by it (docs/models.md#prices)",
    ),
  modelLimits: z
    .array(ModelLimit)
    .max(256)
    .default([])
    .describe("fleet-wide limits on model calls through the workers' gateways (docs/models.md#limits)"),
  sessions: z
    .strictObject({
      templates: z
        .record(SessionTemplateName, SessionTemplate)
        .default({})
        .describe(
          "session templates by name: images any submitter may open a Docker session's container from (docs/sessions.md#templates)",
        ),
    })
    .default({ templates: {} })
    .describe("what sessions may be opened from"),
  queue: QueueLimits.default({}).describe(
    "the most the system holds queued: a submission or workflow start beyond it is refused with queue_full; " +
      "jobs that continue admitted work (handoffs, workflow steps, retries) are not",
  ),
});
export type SystemPolicy = z.infer<typeof SystemPolicy>;

/** The key of the system policy in the policy bucket. */
export const POLICY_KEY = "system";

/** What a call to `call.model` cost by `prices` (0 for a model with no price); tokens read from the prompt cache at their own price when it has one. */
export function priceOf(
  prices: SystemPolicy["prices"],
  call: {
    model?: string | undefined;
    tokensIn: number;
    tokensOut: number;
    cacheReadTokens?: number | undefined;
    cacheWriteTokens?: number | undefined;
  },
): number {
  const price = call.model === undefined ? undefined : prices[call.model];
  if (!price) return 0;
  const cacheRead = price.cacheRead === undefined ? 0 : (call.cacheReadTokens ?? 0);
  const cacheWrite = price.cacheWrite === undefined ? 0 : (call.cacheWriteTokens ?? 0);
  const plainIn = call.tokensIn - cacheRead - cacheWrite;
  const perMillion =
    plainIn * price.in + call.tokensOut * price.out + cacheRead * (price.cacheRead ?? 0) + cacheWrite * (price.cacheWrite ?? 0);
  return perMillion / 1_000_000;
}
export type SystemPolicyInput = z.input<typeof SystemPolicy>;

/** The quota that applies to `user`. Admins and the system's own roles have none. */
export function quotaOf(policy: SystemPolicy, user: string): Quota {
  return policy.quotas.users[user] ?? policy.quotas.default;
}
