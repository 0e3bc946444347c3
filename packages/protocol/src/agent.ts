import { z } from "zod";
import { InputSchema } from "./agent-input.js";
import { AgentModels } from "./models.js";
import { TOKEN_PATTERN } from "./names.js";
import { Priority } from "./priority.js";
import { modelOf, PromptAgent } from "./prompt-agent.js";
import { durationMs, sizeBytes } from "./units.js";

export const PROTOCOL_VERSION = 1 as const;

const token = (what: string) => z.string().regex(TOKEN_PATTERN, `${what} must be 1-64 letters, digits, '-' or '_'`);

export const AgentName = token("agent name");
export const PoolName = token("pool name");

/** What a flow-control limit is kept for each value of: the job's owner, a field of its input, or a label. */
const LimitKey = z
  .string()
  .regex(/^(owner|input(\.[A-Za-z0-9_-]{1,64}){1,8}|label\.[A-Za-z0-9_.-]{1,64})$/, "owner, input.<field>[.<field>...] or label.<name>");

export const SandboxKind = z.enum(["auto", "host", "docker", "e2b"]);
export type SandboxKind = z.infer<typeof SandboxKind>;

/** `none` (default), `bridge`, or the name of a Docker network. */
export const NetworkWish = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, "network must be none, bridge or a network name");

export const MAX_TIMEOUT_MS = 7 * 24 * 3_600_000;

export const ResourceLimits = z.strictObject({
  cpus: z.number().positive().max(256).optional().describe("CPU cores, fractions allowed"),
  memory: sizeBytes({ min: 4 * 1024 ** 2, max: 1024 ** 4 })
    .optional()
    .describe('memory limit, e.g. "512Mi"'),
  pids: z.number().int().min(8).max(1_000_000).optional().describe("maximum number of processes"),
});
export type ResourceLimits = z.infer<typeof ResourceLimits>;

export const RuntimeWishes = z.strictObject({
  sandbox: SandboxKind.default("auto").describe("where the agent runs; auto picks the strongest isolation the worker offers"),
  image: z.string().min(1).max(512).optional().describe("container image (Docker)"),
  template: z.string().min(1).max(256).optional().describe("sandbox template (E2B)"),
  network: NetworkWish.default("none").describe("network access (Docker)"),
  timeout: durationMs({ min: 100, max: MAX_TIMEOUT_MS })
    .default(600_000)
    .describe('run-time limit, such as "10m"; a job\'s `timeout` overrides it'),
  queueTimeout: durationMs({ min: 100, max: MAX_TIMEOUT_MS })
    .optional()
    .describe("a job not started this long after it was queued ends `expired`; a job's `queueTimeout` overrides it"),
  limits: ResourceLimits.default({}),
  warm: z
    .boolean()
    .optional()
    .describe("take a container the worker started before the job came, from its warm pool (Docker): a start in milliseconds"),
});
export type RuntimeWishes = z.infer<typeof RuntimeWishes>;

/** Which failures are retried: a non-zero exit (or an error in the result file), a timeout, a crash (killed by a signal or OOM), a sandbox error. */
export const RetryOn = z.enum(["exit", "timeout", "crash", "sandbox"]);
export type RetryOn = z.infer<typeof RetryOn>;

export const RetryPolicy = z.strictObject({
  maxAttempts: z.number().int().min(1).max(100).default(1).describe("attempts in all, the first included"),
  backoff: z.enum(["fixed", "exponential"]).default("exponential"),
  delay: durationMs({ min: 0, max: 3_600_000 }).default(1_000).describe("wait before the first retry"),
  maxDelay: durationMs({ min: 0, max: 24 * 3_600_000 })
    .default(300_000)
    .describe("cap on the wait"),
  jitter: z.boolean().default(true).describe("wait a random 50-100% of the computed delay"),
  on: z.array(RetryOn).default(["exit", "timeout", "crash", "sandbox"]),
});
export type RetryPolicy = z.infer<typeof RetryPolicy>;

export const EnvName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/, "must be an environment variable name");

export const SecretRef = z.union([
  EnvName.transform((name) => ({ name, from: name })),
  z.strictObject({ name: EnvName, from: EnvName.describe("variable in the worker's environment") }),
]);
export type SecretRef = z.infer<typeof SecretRef>;

/** A glob relative to the workspace: `*`, `**` and `?` are understood; no `..`, no absolute paths. */
export const OutputGlob = z
  .string()
  .min(1)
  .max(256)
  .refine((p) => !p.startsWith("/") && !p.split("/").includes(".."), "must be a relative path without '..'");

export const AgentDefinition = z
  .strictObject({
    v: z.literal(PROTOCOL_VERSION).default(PROTOCOL_VERSION).describe("format version"),
    name: AgentName.describe("the agent's name; jobs name it, and it is the intake subject's last token"),
    description: z.string().max(1024).optional().describe("for people"),
    command: z
      .union(
        [
          z
            .string()
            .min(1)
            .transform((s) => ["sh", "-c", s]),
          z
            .array(z.string())
            .min(1)
            .refine(
              (argv) => !argv[0]?.startsWith("-"),
              "the program (the first argument) may not start with '-': a shell would read it as an option",
            ),
        ],
        { error: () => "expected a command string or a list of arguments" },
      )
      .optional()
      .describe(
        "what to run: a string run with sh -c, or a list of arguments (the first, the program, not starting with `-`); a prompt agent has `prompt` instead",
      ),
    inputSchema: InputSchema.optional(),
    prompt: PromptAgent.optional().describe(
      "a prompt agent (docs/harness.md): its model, prompt and tools; the worker runs its loop and each tool call in its sandbox",
    ),
    pool: PoolName.default("default").describe("the work pool whose workers run this agent; a job can override it"),
    // No default filled in: a definition that does not set it stays readable by releases before priorities.
    priority: Priority.optional().describe("priority of its jobs in the pool; a job can override it"),
    runtime: RuntimeWishes.default({ sandbox: "auto", network: "none", timeout: 600_000, limits: {} }).describe(
      "where and how long it runs",
    ),
    trusted: z
      .boolean()
      .default(false)
      .describe(
        "safe to run without isolation: a worker whose policy lets the host sandbox run trusted agents may run it on the host; only an admin applies agents",
      ),
    env: z.record(EnvName, z.string().max(32_768)).default({}).describe("environment variables"),
    secrets: z.array(SecretRef).default([]).describe("variables copied from the worker's environment"),
    outputs: z.array(OutputGlob).default(["out/**"]).describe("workspace files kept as artifacts"),
    handoffs: z.array(AgentName).default([]).describe("agents this one may hand work to"),
    retry: RetryPolicy.optional().describe("how failed attempts are retried; none: not at all"),
    models: AgentModels.optional().describe(
      "the model providers it calls through its worker's gateway, which holds their keys and meters each call (docs/models.md)",
    ),
    sessions: z
      .boolean()
      .default(false)
      .describe(
        "callers may open sessions in its sandbox and run commands of their own there (docs/sessions.md); a host session is an admin's only",
      ),
    rateLimit: z
      .strictObject({
        starts: z.number().int().min(1).max(1_000_000).describe("how many of its jobs may start in each period"),
        per: durationMs({ min: 1_000, max: 86_400_000 }).describe("the period"),
        burst: z
          .number()
          .int()
          .min(1)
          .default(1)
          .describe("how many may start at once after a quiet spell (1: evenly spaced, `per / starts` apart)"),
        key: LimitKey.optional().describe(
          "limit each value of this on its own: `owner` (the job's user), a field of its input (`input.customerId`) or a label (`label.tenant`); absent: one limit for all the agent's jobs",
        ),
      })
      // Compared only with a starts that is itself right: a wrong one has its own error, and burst none.
      .refine((limit) => !(Number.isInteger(limit.starts) && limit.starts >= 1) || limit.burst <= limit.starts, {
        message: "burst cannot be more than starts",
        path: ["burst"],
      })
      .optional()
      .describe(
        "its jobs start `per / starts` apart (up to `burst` at once after a quiet spell), across every dispatcher and worker (docs/flow-control.md#rate-limits)",
      ),
    concurrency: z
      .strictObject({
        limit: z
          .number()
          .int()
          .min(1)
          .max(1_000)
          .describe("how many of its jobs may hold a place at once: from when one is let go to the workers until it ends"),
        key: LimitKey.optional().describe(
          "a limit for each value of this: `owner`, a field of its input (`input.customerId`) or a label (`label.tenant`); absent: one limit for all the agent's jobs",
        ),
        total: z
          .number()
          .int()
          .min(1)
          .max(100_000)
          .optional()
          .describe("with a `key`: how many of its jobs may hold a place at once over all values of the key together"),
        strategy: z
          .enum(["queue", "cancel-in-progress", "drop-new"])
          .default("queue")
          .describe(
            "a job that finds no free place: `queue` waits for one; `cancel-in-progress` cancels the oldest jobs so that the newest `limit` run; `drop-new` is refused (`conflict`)",
          ),
      })
      .refine((limit) => limit.total === undefined || limit.key !== undefined, {
        message: "a total applies over the values of a key: give the limit a key, or no total",
        path: ["total"],
      })
      .optional()
      .describe("how many of its jobs may run at once, across every dispatcher and worker (docs/flow-control.md#concurrency-limits)"),
    git: z
      .strictObject({
        hosts: z
          .array(z.string().regex(/^[A-Za-z0-9.-]{1,253}(:\d{1,5})?$/, "a host name, with :port where it is not the default"))
          .min(1)
          .max(64)
          .describe(
            "the hosts its sessions may clone from (https:// or git://), by name, with :port where it is not the scheme's own (a name alone allows that port only)",
          ),
        credential: EnvName.optional().describe(
          "a variable of the worker's environment (on its secrets allow-list) sent as the HTTPS password to those hosts when cloning; never given to the session",
        ),
      })
      .optional()
      .describe("where its sessions may clone their workspace from (docs/sessions.md#git)"),
  })
  // One way to run: a command, or a prompt the worker's harness runs.
  .refine((agent) => (agent.command === undefined) !== (agent.prompt === undefined), {
    message: "give the agent a command or a prompt (a .prompt file), one of the two",
    path: ["command"],
  })
  .refine((agent) => !agent.prompt || !agent.models || agent.models.providers.includes(modelOf(agent.prompt.model).provider), {
    message: "models.providers must include the provider of prompt.model",
    path: ["models", "providers"],
  });
/** An agent definition as stored and run (defaults filled, units converted). */
export type AgentDefinition = z.infer<typeof AgentDefinition>;
/** An agent definition as written in a file. */
export type AgentDefinitionInput = z.input<typeof AgentDefinition>;

/** Values that are credentials by their form: provider key prefixes, private keys, JWTs. */
const CREDENTIAL_FORMS = [
  /^(sk|pk|rk)[-_](live|test|proj|ant)?[-_]?[A-Za-z0-9_-]{16,}/, // OpenAI, Anthropic, Stripe style
  /^(ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_]{20,}/,
  /^xox[abposr]-[A-Za-z0-9-]{10,}/,
  /^(AKIA|ASIA)[0-9A-Z]{16}$/,
  /^AIza[0-9A-Za-z_-]{30,}/,
  /-----BEGIN [A-Z ]*PRIVATE KEY-----/,
  /^eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\./,
  /^S[UAON][A-Z2-7]{56}$/, // an nkey seed
];
/** Names that say "secret", with a value long enough to be one. */
const CREDENTIAL_NAME = /(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE)/i;

/**
 * The `env` entries of an agent definition that look like credentials: `env` values are stored
 * in clear in the definition (and in every work item), so keys and tokens belong in `secrets`,
 * read from the worker's environment when the job runs. A heuristic: a value of a known
 * credential form, or a value of 12 characters or more under a name that says key, token,
 * secret or password.
 */
export function credentialLikeEnv(env: Readonly<Record<string, string>>): { path: string; message: string }[] {
  const issues: { path: string; message: string }[] = [];
  for (const [name, value] of Object.entries(env)) {
    const byForm = CREDENTIAL_FORMS.some((form) => form.test(value));
    const byName = CREDENTIAL_NAME.test(name) && value.length >= 12 && !/\s/.test(value);
    if (byForm || byName) {
      issues.push({
        path: `env.${name}`,
        message: `looks like a credential; env values are stored in clear: put it in the worker's environment and list it under secrets (secrets: [${name}])`,
      });
    }
  }
  return issues;
}
