import { type AgentDefinition, BoxcarError, ErrorCode, type ErrorIssue, SIGNALS_DIR, type WorkItem } from "@boxcar/protocol";

/**
 * What every agent finds in its workspace, whatever the sandbox (see the package README).
 * Paths are workspace-relative.
 */
export const AgentPaths = {
  /** The job's input as JSON. */
  input: ".boxcar/input.json",
  /** Where the agent may write its result: `{ output?, summary?, error?, retry?, handoff? }`. */
  result: ".boxcar/result.json",
  /** Where the agent may report what its calls to its provider used, one JSON object a line: `{ model?, tokensIn?, tokensOut?, cost? }`. */
  usage: ".boxcar/usage.jsonl",
  /** Where signals sent to the running job arrive, one file each: `<n>-<name>.json`, `{ name, payload, at }`. */
  signals: SIGNALS_DIR,
  /** The handoff chain so far: `{ root, depth, history: [{ jobId, agent, summary }], run?, step? }`. */
  chain: ".boxcar/chain.json",
  /** The agent's TMPDIR. */
  tmp: ".boxcar/tmp",
  /** Files the agent keeps: the default artifact glob is `out/**`. */
  output: "out",
  /** Reserved for Boxcar: never an input file or an artifact. */
  reserved: ".boxcar",
} as const;

/** The largest result file read; its output lands in the job record. */
export const MAX_RESULT_BYTES = 256 * 1024;

/**
 * The values of the agent's secrets, from the worker's allowed secrets (`secretsEnv`: its keys
 * are the allow-list). Throws a `missing_secret` error naming every variable that is not
 * allowed or not set, and what to change (never a value).
 */
export function collectSecrets(agent: AgentDefinition, secretsEnv: Readonly<Record<string, string | undefined>>): Map<string, string> {
  const values = new Map<string, string>();
  const missing: ErrorIssue[] = [];
  const names: string[] = [];
  for (const [i, { name, from }] of agent.secrets.entries()) {
    const allowed = Object.hasOwn(secretsEnv, from);
    const value = secretsEnv[from];
    if (value !== undefined) {
      values.set(name, value);
      continue;
    }
    missing.push({
      path: `secrets[${i}]`,
      message: allowed
        ? `${from} is not set in the worker's environment`
        : `${from} is not on the worker's secrets allow-list: start the worker with --allow-secret ${from} (or secrets.allow in its config file)`,
    });
    names.push(name === from ? name : `${name} (from ${from})`);
  }
  if (missing.length > 0) {
    const plural = missing.length > 1;
    throw new BoxcarError(
      ErrorCode.missingSecret,
      `agent ${agent.name} needs the secret${plural ? "s" : ""} ${names.join(", ")}: ${missing.map((m) => m.message).join("; ")}`,
      { issues: missing },
    );
  }
  return values;
}

export interface AgentEnvParams {
  item: WorkItem;
  attempt: number;
  /** The workspace as seen inside the sandbox. */
  workspace: string;
  /** PATH for the agent: the worker's own. */
  path: string;
  secrets: ReadonlyMap<string, string>;
  /** When the worker stops the attempt (its timeout or the job's deadline), in ms since the epoch. */
  stopAt: number;
  /** The attempt's span (W3C `traceparent`), when the job is traced: the agent's own spans join it. */
  traceparent?: string;
  /** Where the worker's traces go (`OTEL_EXPORTER_OTLP_*ENDPOINT`), so an agent's spans can go there too. */
  tracing?: Readonly<Record<string, string>>;
}

/**
 * The agent's complete environment: PATH, HOME, LANG and TMPDIR and where the worker's traces go
 * (if anywhere), then the agent's `env`, then its secrets, then the BOXCAR_* variables and, for a
 * traced job, TRACEPARENT (which nothing overrides).
 */
export function agentEnv({
  item,
  attempt,
  workspace,
  path,
  secrets,
  stopAt,
  traceparent,
  tracing,
}: AgentEnvParams): Record<string, string> {
  const inWorkspace = (p: string) => `${workspace}/${p}`;
  return {
    PATH: path,
    HOME: workspace,
    LANG: "C.UTF-8",
    TMPDIR: inWorkspace(AgentPaths.tmp),
    ...tracing,
    ...item.agent.env,
    ...Object.fromEntries(secrets),
    BOXCAR_JOB_ID: item.jobId,
    BOXCAR_ATTEMPT: String(attempt),
    BOXCAR_AGENT: item.agent.name,
    BOXCAR_WORKSPACE: workspace,
    BOXCAR_INPUT_FILE: inWorkspace(AgentPaths.input),
    BOXCAR_RESULT_FILE: inWorkspace(AgentPaths.result),
    BOXCAR_USAGE_FILE: inWorkspace(AgentPaths.usage),
    BOXCAR_SIGNALS_DIR: inWorkspace(AgentPaths.signals),
    BOXCAR_CHAIN_FILE: inWorkspace(AgentPaths.chain),
    BOXCAR_OUTPUT_DIR: inWorkspace(AgentPaths.output),
    BOXCAR_STOP_AT: String(stopAt),
    // A job in a session (docs/sessions.md#jobs-in-a-session): a handoff that names it stays in it.
    ...(item.session !== undefined ? { BOXCAR_SESSION: item.session } : {}),
    ...(traceparent ? { TRACEPARENT: traceparent } : {}),
  };
}
