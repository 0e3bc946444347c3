import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { type Logger, silentLogger } from "@boxcar/common";
import { type Topology, WorkVerifier } from "@boxcar/fabric";
import {
  AgentPolicy,
  type AgentPolicyInput,
  BoxcarError,
  ErrorCode,
  type ModelProvider,
  PoolName,
  parseWith,
  RuntimePolicy,
  type RuntimePolicyInput,
  TOKEN_PATTERN,
  type WorkerConfig,
} from "@boxcar/protocol";
import type { Registry } from "prom-client";
import { z } from "zod";
import type { GatewayOptions } from "./gateway/gateway.js";
import { sandboxProviders } from "./sandbox/providers.js";
import type { SandboxProvider } from "./sandbox/sandbox.js";
import { defaultWorkRoot } from "./workspace/work-root.js";

export interface WorkerOptions {
  /** The Boxcar system to work for. */
  topology: Topology;
  /** Pools to pull work from; default `["default"]`. */
  pools?: string[];
  /** Jobs run at once across all pools; default 4. */
  concurrency?: number;
  /** Default `w-<hostname>-<random>`; letters, digits, `-` and `_`. */
  workerId?: string;
  /** A pino-compatible logger; silent by default. */
  logger?: Logger;
  /**
   * The variables of this worker's environment that agents may be given as secrets (its
   * allow-list); an agent that names another fails with `missing_secret`. Default: none.
   */
  allowSecrets?: readonly string[];
  /**
   * The secrets agents may be given, with their values: when set, these and only these (instead
   * of `allowSecrets` read from the environment).
   */
  secretsEnv?: Readonly<Record<string, string | undefined>>;
  /** Sandbox backends; default host and Docker, with workspaces under `workRoot`. */
  providers?: SandboxProvider[];
  /** Default: every backend allowed, strongest isolation preferred, host only for trusted agents. */
  policy?: RuntimePolicyInput;
  /** How often presence and a heartbeat event are published; default 5000 ms. */
  heartbeatMs?: number;
  /**
   * How often they are published while the worker is idle (no job, no session) and its presence
   * unchanged; default three heartbeats (15000 ms by default), and never less than `heartbeatMs`.
   */
  idleHeartbeatMs?: number;
  /** How long `drain()` lets running jobs finish before handing them back; default 30000 ms. */
  drainGraceMs?: number;
  /** Agent output kept per job; default 4 MiB. */
  maxLogBytes?: number;
  /**
   * How long an attempt's results (its artifacts, output and events) wait for room while
   * JetStream's store is full, from the first write refused, before the job fails
   * `storage_full`; never past the job's deadline. Its record waits for as long as it takes.
   * Default 600000 ms (10 minutes); 0 fails the job at once, as before.
   */
  roomWaitMs?: number;
  /** Where the default providers stage workspaces; default `/dev/shm` where it is a roomy tmpfs, else the OS temporary folder. */
  workRoot?: string;
  /** How often sandboxes left by crashed workers are looked for (and at start); default 60000 ms. */
  reapIntervalMs?: number;
  /** How often a running agent's usage file is read, so that its calls count (and budgets stop) as it makes them; default 10000 ms. */
  usageReadMs?: number;
  /** OpenTelemetry variables (where this worker's traces go) given to every agent, so its own spans can follow. */
  agentTracing?: Readonly<Record<string, string>>;
  /**
   * How long the events of a new attempt are held back: one that ends sooner stores its last
   * event with the others folded in (two stored messages instead of seven for a no-op job);
   * default 250 ms; 0 stores every event as it happens.
   */
  eventHoldMs?: number;
  /**
   * Public keys (`U...`) of the dispatchers whose signed work items this worker runs; any other
   * item is terminated unrun with a `work_rejected` event. Absent: items are not checked (a
   * NATS system without authentication, where anyone could publish work anyway). A
   * `WorkVerifier` instead of a list lets the caller change the keys while the worker runs
   * (`boxcar worker` re-reads its `--dispatcher-keys` file during a rotation).
   */
  dispatcherKeys?: readonly string[] | WorkVerifier;
  /**
   * What this worker lets agents ask for (networks, images, limits, ...), whatever the
   * dispatcher's policy: a job whose agent asks for more fails with `policy_denied` unrun.
   */
  agentPolicy?: AgentPolicyInput;
  /** A Prometheus registry to put this worker's metrics in (docs/observability.md); absent: none are kept. */
  metrics?: Registry;
  /**
   * The model gateway (docs/models.md): the providers' keys this worker holds for its agents'
   * model calls, and where it listens (default 127.0.0.1, a free port). Absent or no providers:
   * no gateway, and agents that list `models` cannot run here.
   */
  modelGateway?: GatewayOptions;
}

export interface ResolvedWorkerOptions {
  topology: Topology;
  pools: string[];
  concurrency: number;
  workerId: string;
  logger: Logger;
  /** The allowed secrets (every key is allowed; an undefined value is allowed but not set). */
  secretsEnv: Readonly<Record<string, string | undefined>>;
  providers: SandboxProvider[];
  policy: RuntimePolicy;
  heartbeatMs: number;
  idleHeartbeatMs: number;
  drainGraceMs: number;
  maxLogBytes: number;
  roomWaitMs: number;
  workRoot: string;
  reapIntervalMs: number;
  usageReadMs: number;
  eventHoldMs: number;
  /** Checks work items' signatures; undefined: items are not checked. */
  verifier: WorkVerifier | undefined;
  /** This worker's own limits on what agents ask for; undefined: none. */
  agentPolicy: AgentPolicy | undefined;
  /** Where its metrics go; undefined: none are kept. */
  metrics: Registry | undefined;
  /** PATH given to agents: the worker's own. */
  agentPath: string;
  agentTracing: Readonly<Record<string, string>>;
  modelGateway: GatewayOptions | undefined;
}

const Settings = z.strictObject({
  pools: z
    .array(PoolName)
    .min(1)
    .refine((p) => new Set(p).size === p.length, "pools must not repeat"),
  concurrency: z.number().int().min(1).max(1024),
  workerId: z.string().regex(TOKEN_PATTERN, "worker id must be 1-64 letters, digits, '-' or '_'"),
  policy: RuntimePolicy,
  heartbeatMs: z.number().int().min(100),
  idleHeartbeatMs: z.number().int().min(100),
  drainGraceMs: z.number().int().nonnegative(),
  maxLogBytes: z.number().int().min(1024),
  roomWaitMs: z
    .number()
    .int()
    .min(0)
    .max(24 * 3_600_000),
  workRoot: z.string().min(1),
  reapIntervalMs: z.number().int().min(100),
  usageReadMs: z.number().int().min(100),
  eventHoldMs: z.number().int().min(0).max(60_000),
});

const DEFAULT_HEARTBEAT_MS = 5_000;
/** An idle worker's presence is written once every this many heartbeats (docs/architecture.md, worker presence). */
const IDLE_HEARTBEATS = 3;

/** How long a new attempt's events are held back to be folded into its last, by default. */
const DEFAULT_EVENT_HOLD_MS = 250;

/**
 * How long an attempt's results wait for room in a full store, by default: long enough for
 * retention (a sweep a minute) or an admin's `boxcar clean` to free some, short enough that a
 * store nobody frees does not hold the job's sandbox for long.
 */
const DEFAULT_ROOM_WAIT_MS = 10 * 60_000;

const DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** Fills in defaults and checks every setting; throws an `invalid` error naming the bad ones. */
export function resolveWorkerOptions(opts: WorkerOptions, env: NodeJS.ProcessEnv = process.env): ResolvedWorkerOptions {
  const settings = parseWith(
    Settings,
    {
      pools: opts.pools ?? ["default"],
      concurrency: opts.concurrency ?? 4,
      workerId: opts.workerId ?? defaultWorkerId(),
      policy: opts.policy ?? {},
      heartbeatMs: opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS,
      idleHeartbeatMs: Math.max(
        opts.idleHeartbeatMs ?? IDLE_HEARTBEATS * (opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS),
        opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS,
      ),
      drainGraceMs: opts.drainGraceMs ?? 30_000,
      maxLogBytes: opts.maxLogBytes ?? 4 * 1024 * 1024,
      roomWaitMs: opts.roomWaitMs ?? DEFAULT_ROOM_WAIT_MS,
      workRoot: opts.workRoot ?? defaultWorkRoot(),
      reapIntervalMs: opts.reapIntervalMs ?? 60_000,
      usageReadMs: opts.usageReadMs ?? 10_000,
      eventHoldMs: opts.eventHoldMs ?? DEFAULT_EVENT_HOLD_MS,
    },
    "worker options",
  );
  const providers =
    opts.providers ??
    sandboxProviders({}, { prefix: opts.topology.names.prefix, system: opts.topology.systemId, workRoot: settings.workRoot, env });
  const kinds = providers.map((p) => p.kind);
  const repeated = kinds.find((k, i) => kinds.indexOf(k) !== i);
  if (repeated) throw new BoxcarError(ErrorCode.invalid, `worker options: two sandbox providers of kind ${repeated}; give one per kind`);
  return {
    ...settings,
    topology: opts.topology,
    logger: opts.logger ?? silentLogger,
    secretsEnv: opts.secretsEnv ?? Object.fromEntries((opts.allowSecrets ?? []).map((name) => [name, env[name]])),
    providers,
    verifier:
      opts.dispatcherKeys instanceof WorkVerifier
        ? opts.dispatcherKeys
        : opts.dispatcherKeys
          ? new WorkVerifier(opts.dispatcherKeys)
          : undefined,
    agentPolicy: opts.agentPolicy ? parseWith(AgentPolicy, opts.agentPolicy, "worker options: agentPolicy") : undefined,
    metrics: opts.metrics,
    agentPath: env.PATH ?? DEFAULT_PATH,
    agentTracing: opts.agentTracing ?? {},
    modelGateway: opts.modelGateway && Object.keys(opts.modelGateway.providers).length > 0 ? opts.modelGateway : undefined,
  };
}

/** `w-<hostname>-<random>`, cut to a subject token. */
function defaultWorkerId(): string {
  const host =
    hostname()
      .replace(/[^A-Za-z0-9_-]/g, "-")
      .slice(0, 48) || "host";
  return `w-${host}-${randomBytes(4).toString("hex")}`;
}

/**
 * Worker options from a worker config file (already merged with flags by the caller): settings,
 * policy and sandbox providers. The topology and logger come from the caller.
 */
export function workerOptionsFromConfig(
  config: WorkerConfig,
  topology: Topology,
  env: Readonly<Record<string, string | undefined>> = process.env,
): WorkerOptions {
  const workRoot = config.workRoot ?? defaultWorkRoot();
  const sandbox = config.sandbox ?? {};
  const policy = {
    ...(sandbox.allowed ? { allowed: sandbox.allowed } : {}),
    ...(sandbox.prefer ? { prefer: sandbox.prefer } : {}),
    ...(sandbox.host ? { host: sandbox.host } : {}),
  };
  return {
    topology,
    workRoot,
    policy,
    providers: sandboxProviders(sandbox, { prefix: topology.names.prefix, system: topology.systemId, workRoot, env }),
    ...(config.pools ? { pools: config.pools } : {}),
    ...(config.concurrency ? { concurrency: config.concurrency } : {}),
    ...(config.heartbeat !== undefined ? { heartbeatMs: config.heartbeat } : {}),
    ...(config.idleHeartbeat !== undefined ? { idleHeartbeatMs: config.idleHeartbeat } : {}),
    ...(config.drainGrace !== undefined ? { drainGraceMs: config.drainGrace } : {}),
    ...(config.roomWait !== undefined ? { roomWaitMs: config.roomWait } : {}),
    ...(config.reapInterval !== undefined ? { reapIntervalMs: config.reapInterval } : {}),
    ...(config.usageRead !== undefined ? { usageReadMs: config.usageRead } : {}),
    ...(config.maxLogBytes !== undefined ? { maxLogBytes: config.maxLogBytes } : {}),
    ...(config.dispatcherKeys ? { dispatcherKeys: config.dispatcherKeys } : {}),
    ...(config.secrets?.allow ? { allowSecrets: config.secrets.allow } : {}),
    ...(config.policy ? { agentPolicy: config.policy } : {}),
    ...(config.models ? { modelGateway: gatewayFromConfig(config.models, env) } : {}),
  };
}

/** The gateway's options from the config's `models`: each key read from the variable it names, which must be set. */
function gatewayFromConfig(models: NonNullable<WorkerConfig["models"]>, env: Readonly<Record<string, string | undefined>>): GatewayOptions {
  const providers: GatewayOptions["providers"] = {};
  for (const [provider, variable] of Object.entries(models.keys) as [ModelProvider, string][]) {
    const key = env[variable];
    if (!key) {
      throw new BoxcarError(ErrorCode.invalid, `models.keys.${provider}: ${variable} is not set in the worker's environment`);
    }
    const baseUrl = models.urls?.[provider];
    providers[provider] = { key, ...(baseUrl ? { baseUrl } : {}) };
  }
  const listen = models.listen ? parseListen(models.listen) : undefined;
  return {
    providers,
    ...(listen ? { host: listen.host, port: listen.port } : {}),
    ...(models.publicUrl ? { publicUrl: models.publicUrl } : {}),
  };
}

function parseListen(listen: string): { host: string; port: number } {
  const match = /^(.+):(\d{1,5})$/.exec(listen);
  const port = Number(match?.[2]);
  if (!match || port > 65_535) throw new BoxcarError(ErrorCode.invalid, `models.listen must be HOST:PORT, got ${JSON.stringify(listen)}`);
  return { host: (match[1] as string).replace(/^\[(.*)\]$/, "$1"), port };
}
