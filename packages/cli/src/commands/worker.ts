import { readFile } from "node:fs/promises";
import type { Logger } from "@boxcar/common";
import { WorkVerifier } from "@boxcar/fabric";
import { MODEL_PROVIDERS, ModelProvider, parseYamlFile, SandboxBackend, WorkerConfig } from "@boxcar/protocol";
import type { Command, Values } from "../command.js";
import { connectionFrom } from "../context.js";
import { ExitCode } from "../exit-codes.js";
import { logFormat, optionalDuration, positiveInt, readLogFormat, wholeNumber } from "../flags.js";
import { HealthEndpoint } from "../health.js";
import { createLogger } from "../logger.js";
import { MetricsEndpoint } from "../metrics.js";
import { listenAddressFrom } from "../role-endpoint.js";
import { onStop, openRoleSession, systemOptions, systemOptionsFrom, unlessStopped } from "../role-session.js";
import { startRoleTracing } from "../tracing.js";
import { UsageError } from "../usage-error.js";

const usage =
  "boxcar worker [--config FILE] [--pool POOL]... [--concurrency N] [--sandboxes host,docker,e2b] [--prefer e2b,docker,host] " +
  "[--host never|trusted|always] [--docker-image IMAGE] [--docker-warm N] [--work-root DIR] [--agent-traces URL] [--dispatcher-keys FILE|KEY,...] [--allow-secret NAME]... [--model-key PROVIDER=VARIABLE]... [--model-url PROVIDER=URL]... [--model-gateway HOST:PORT] [--model-gateway-url URL] [--drain-grace 30s] [--heartbeat 5s] [--idle-heartbeat 15s] [--health HOST:PORT] [--metrics HOST:PORT] [--replicas 1|3|5] [--stream-limits events=SIZE,logs=SIZE,dead=SIZE] [--log-format json|pretty]";

export const worker: Command = {
  usage,
  maxArgs: 0,
  options: {
    config: { type: "string" },
    pool: { type: "string", multiple: true, default: [] },
    concurrency: { type: "string" },
    sandboxes: { type: "string" },
    prefer: { type: "string" },
    host: { type: "string" },
    "docker-image": { type: "string" },
    "docker-warm": { type: "string" },
    "work-root": { type: "string" },
    "agent-traces": { type: "string" },
    "drain-grace": { type: "string" },
    "dispatcher-keys": { type: "string" },
    "allow-secret": { type: "string", multiple: true, default: [] },
    "model-key": { type: "string", multiple: true, default: [] },
    "model-url": { type: "string", multiple: true, default: [] },
    "model-gateway": { type: "string" },
    "model-gateway-url": { type: "string" },
    heartbeat: { type: "string" },
    "idle-heartbeat": { type: "string" },
    health: { type: "string" },
    metrics: { type: "string" },
    ...systemOptions,
    ...logFormat,
  },
  async run(ctx) {
    const file = ctx.values.config as string | undefined;
    const config = merge(file ? await readWorkerConfig(file) : {}, flagsAsConfig(ctx.values, ctx.io.env));
    const logger = createLogger(config.logFormat);
    const healthAddress = listenAddressFrom("health", ctx.values.health, ctx.io.env, config.health);
    const metricsAddress = listenAddressFrom("metrics", ctx.values.metrics, ctx.io.env, config.metrics);
    // Flags, then the environment, then a `nats` context, then the file, then the default.
    const connection = connectionFrom(ctx.values, ctx.io.env, config);
    const keySources = config.dispatcherKeys ?? [];
    const dispatcherKeys = await readDispatcherKeys(keySources);
    if (dispatcherKeys.length === 0 && connection.creds !== undefined) {
      throw new UsageError(
        "a worker that logs in to NATS runs only signed work items: give --dispatcher-keys FILE (the dispatchers.pub `boxcar auth init` wrote) or BOXCAR_DISPATCHER_KEYS",
      );
    }
    const prefix = (ctx.values.prefix as string | undefined) ?? config.prefix;
    // The system's shape: the file's, each part replaced by a flag or variable given for it.
    const system = {
      ...(config.replicas !== undefined ? { replicas: config.replicas } : {}),
      ...(config.streamLimits ? { streamLimits: config.streamLimits } : {}),
      ...systemOptionsFrom(ctx.values, ctx.io.env),
    };
    // Listening before NATS is reached: a worker waiting for the cluster is alive, not ready.
    await using health = new HealthEndpoint(logger);
    if (healthAddress) await health.listen(healthAddress);
    await using metrics = await MetricsEndpoint.open(metricsAddress, logger);
    await using _tracing = await startRoleTracing("boxcar-worker", ctx.io.env, logger);
    const { signal } = ctx.io;
    await using session = await unlessStopped(
      signal,
      openRoleSession(connection, prefix, "boxcar-worker", logger, {
        ...system,
        connected: (nc) => health.follow(nc),
        signal,
      }),
      logger,
    );
    if (!session) return ExitCode.ok;
    const verifier = dispatcherKeys.length > 0 ? new WorkVerifier(dispatcherKeys) : undefined;
    // Where agents may send their own spans: given to them only when the operator names it.
    const agentTraces = agentTracesEndpoint(ctx.values["agent-traces"] ?? ctx.io.env.BOXCAR_AGENT_TRACES);
    // Loaded here, not with the module: `worker --help` and a bad flag answer without Docker, E2B and the AI SDK.
    const { createWorker, workerOptionsFromConfig } = await import("@boxcar/worker");
    const w = createWorker({
      ...workerOptionsFromConfig(config, session.topology, ctx.io.env),
      logger,
      ...(verifier ? { dispatcherKeys: verifier } : {}),
      ...(metrics ? { metrics: metrics.registry } : {}),
      ...(agentTraces ? { agentTracing: { OTEL_EXPORTER_OTLP_ENDPOINT: agentTraces } } : {}),
    });
    health.report(() => (w.accepting ? "ready" : w.state === "idle" || w.state === "running" ? "starting" : w.state));
    const running = w.run();
    const stopReloading = verifier ? reloadDispatcherKeys(keySources, verifier, logger) : () => {};
    onStop(signal, () => void w.drain());
    await running;
    stopReloading();
    await w.close();
    return ExitCode.ok;
  },
};

async function readWorkerConfig(file: string): Promise<WorkerConfig> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    throw new UsageError(`cannot read worker config ${file}: ${(err as Error).message}`);
  }
  return parseYamlFile(text, file, WorkerConfig, "worker config");
}

/** The flags given, in the config file's shape; each is checked and named when wrong. */
function flagsAsConfig(values: Values, env: NodeJS.ProcessEnv): WorkerConfig {
  const pools = values.pool as string[];
  const backends = (flag: string): SandboxBackend[] | undefined => {
    const value = values[flag] as string | undefined;
    if (value === undefined) return undefined;
    return value.split(",").map((b) => {
      const parsed = SandboxBackend.safeParse(b.trim());
      if (!parsed.success) throw new UsageError(`--${flag}: ${JSON.stringify(b)} is not one of host, docker, e2b`);
      return parsed.data;
    });
  };
  const host = values.host as string | undefined;
  if (host !== undefined && !["never", "trusted", "always"].includes(host)) {
    throw new UsageError(`--host must be never, trusted or always, got ${host}`);
  }
  const allowed = backends("sandboxes");
  const prefer = backends("prefer");
  const grace = optionalDuration(values["drain-grace"], "--drain-grace");
  const heartbeat = optionalDuration(values.heartbeat, "--heartbeat");
  const idleHeartbeat = optionalDuration(values["idle-heartbeat"], "--idle-heartbeat");
  const logFormatValue = readLogFormat(values["log-format"]);
  const keys = (values["dispatcher-keys"] as string | undefined) ?? env.BOXCAR_DISPATCHER_KEYS;
  const allowSecrets = values["allow-secret"] as string[];
  const warm = values["docker-warm"] !== undefined ? wholeNumber(values["docker-warm"], "--docker-warm", 0, 64) : undefined;
  const modelKeys = providerPairs(values["model-key"] as string[], "--model-key", "VARIABLE");
  const modelUrls = providerPairs(values["model-url"] as string[], "--model-url", "URL");
  const gatewayListen = values["model-gateway"] as string | undefined;
  const gatewayUrl = values["model-gateway-url"] as string | undefined;
  if ((Object.keys(modelUrls).length > 0 || gatewayListen || gatewayUrl) && Object.keys(modelKeys).length === 0) {
    throw new UsageError(
      "--model-url, --model-gateway and --model-gateway-url configure the model gateway: give --model-key PROVIDER=VARIABLE too",
    );
  }
  return {
    ...(Object.keys(modelKeys).length > 0
      ? {
          models: {
            keys: modelKeys,
            ...(Object.keys(modelUrls).length > 0 ? { urls: modelUrls } : {}),
            ...(gatewayListen ? { listen: gatewayListen } : {}),
            ...(gatewayUrl ? { publicUrl: gatewayUrl } : {}),
          },
        }
      : {}),
    ...(allowSecrets.length > 0 ? { secrets: { allow: allowSecrets } } : {}),
    ...(keys ? { dispatcherKeys: keys.split(",").map((k) => k.trim()) } : {}),
    ...(pools.length > 0 ? { pools } : {}),
    ...(values.concurrency !== undefined ? { concurrency: positiveInt(values.concurrency, "--concurrency", 4, 1024) } : {}),
    ...(grace !== undefined ? { drainGrace: grace } : {}),
    ...(heartbeat !== undefined ? { heartbeat } : {}),
    ...(idleHeartbeat !== undefined ? { idleHeartbeat } : {}),
    ...(logFormatValue ? { logFormat: logFormatValue } : {}),
    sandbox: {
      ...(allowed ? { allowed } : {}),
      ...(prefer ? { prefer } : {}),
      ...(host ? { host: host as "never" | "trusted" | "always" } : {}),
      ...(values["docker-image"] || warm !== undefined
        ? {
            docker: {
              ...(values["docker-image"] ? { image: values["docker-image"] as string } : {}),
              ...(warm !== undefined ? { warm } : {}),
            },
          }
        : {}),
    },
    ...(values["work-root"] ? { workRoot: values["work-root"] as string } : {}),
  };
}

/** `PROVIDER=VALUE` flags as a record; a provider that is not one, or a pair without `=`, is a usage error naming it. */
function providerPairs(pairs: readonly string[], flag: string, what: string): Partial<Record<ModelProvider, string>> {
  const out: Partial<Record<ModelProvider, string>> = {};
  for (const pair of pairs) {
    const at = pair.indexOf("=");
    const provider = ModelProvider.safeParse(pair.slice(0, at));
    if (at < 1 || !provider.success || at === pair.length - 1) {
      throw new UsageError(
        `${flag} takes PROVIDER=${what} with PROVIDER one of ${MODEL_PROVIDERS.join(", ")}, got ${JSON.stringify(pair)}`,
      );
    }
    const value = pair.slice(at + 1);
    const problem = what === "URL" ? urlProblem(value) : /^[A-Za-z_][A-Za-z0-9_]{0,127}$/.test(value) ? undefined : "not a variable name";
    if (problem) throw new UsageError(`${flag} ${pair}: ${problem}`);
    out[provider.data] = value;
  }
  return out;
}

function urlProblem(value: string): string | undefined {
  try {
    const url = new URL(value);
    return url.protocol === "http:" || url.protocol === "https:" ? undefined : "not an http(s) URL";
  } catch {
    return "not a URL";
  }
}

/** How often `--dispatcher-keys` files are read again. */
const KEYS_RELOAD_MS = 5_000;

/**
 * Reads the key files again every few seconds and trusts what they hold, so a dispatcher's key
 * rotation (`boxcar auth rotate`, which lists the old and new key until it is finished) needs no
 * worker restart. A file that does not read as keys leaves the trusted keys as they were.
 */
function reloadDispatcherKeys(sources: readonly string[], verifier: WorkVerifier, logger: Logger): () => void {
  if (sources.every((s) => DISPATCHER_KEY.test(s))) return () => {};
  const timer = setInterval(() => {
    readDispatcherKeys(sources).then(
      (keys) => {
        if (keys.length === 0 || [...keys].sort().join() === verifier.trusted.sort().join()) return;
        verifier.trust(keys);
        logger.info({ keys: keys.length }, "dispatcher keys reloaded");
      },
      (err: unknown) => logger.warn({ err: (err as Error).message }, "dispatcher keys not reloaded: keeping the ones trusted"),
    );
  }, KEYS_RELOAD_MS);
  timer.unref();
  return () => clearInterval(timer);
}

const DISPATCHER_KEY = /^U[A-Z2-7]{55}$/;

/** Dispatcher public keys: each source is a key (`U...`) or a file of keys, one per line. */
async function readDispatcherKeys(sources: readonly string[]): Promise<string[]> {
  const keys: string[] = [];
  for (const source of sources) {
    if (DISPATCHER_KEY.test(source)) {
      keys.push(source);
      continue;
    }
    let text: string;
    try {
      text = await readFile(source, "utf8");
    } catch (err) {
      throw new UsageError(`--dispatcher-keys: ${source} is neither a public key (U...) nor a readable file: ${(err as Error).message}`);
    }
    for (const key of text.split(/\s+/).filter((k) => k !== "")) {
      if (!DISPATCHER_KEY.test(key)) {
        throw new UsageError(
          `--dispatcher-keys: ${source} holds ${JSON.stringify(key.slice(0, 16))}, not a dispatcher public key (U...): give the dispatchers.pub file \`boxcar auth init\` wrote`,
        );
      }
      keys.push(key);
    }
  }
  return keys;
}

/** `over` wins field by field, sandbox settings included. */
function merge(base: WorkerConfig, over: WorkerConfig): WorkerConfig {
  const sandbox = { ...base.sandbox, ...over.sandbox };
  if (base.sandbox?.docker || over.sandbox?.docker) sandbox.docker = { ...base.sandbox?.docker, ...over.sandbox?.docker };
  return { ...base, ...over, sandbox };
}

/** `--agent-traces URL` (or BOXCAR_AGENT_TRACES): an http(s) URL with no credentials in it, since every agent sees it. */
function agentTracesEndpoint(value: unknown): string | undefined {
  if (value === undefined || value === "") return undefined;
  let url: URL;
  try {
    url = new URL(String(value));
  } catch {
    throw new UsageError(`--agent-traces must be an http(s) URL, got ${String(value)}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new UsageError(`--agent-traces must be an http(s) URL, got ${url.protocol}`);
  if (url.username || url.password)
    throw new UsageError("--agent-traces must not carry credentials: every agent it is given to can read it");
  return String(value);
}
