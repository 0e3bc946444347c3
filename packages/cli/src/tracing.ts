import type { Logger } from "@boxcar/common";
import { UsageError } from "./usage-error.js";

/** The OpenTelemetry variables that name where traces go (the SDK's own, read by its exporter). */
const ENDPOINT_VARIABLES = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"] as const;

/** Where a role's traces go, from the standard OpenTelemetry variables; undefined: nowhere. */
export function tracesEndpoint(env: Readonly<Record<string, string | undefined>>): string | undefined {
  if (env.OTEL_TRACES_EXPORTER === "none" || env.OTEL_SDK_DISABLED === "true") return undefined;
  return ENDPOINT_VARIABLES.map((name) => env[name]).find((value) => value !== undefined && value !== "");
}

/**
 * Sends a role's spans (`service.name` = `role`) over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT`
 * (or `…_TRACES_ENDPOINT`) is set, in batches (every 5 s, or 512 spans); the exporter reads its
 * other `OTEL_EXPORTER_OTLP_*` settings (headers, timeout) itself. Which traces are kept is the
 * standard `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (`traceSampling`); by default
 * every one. Without an endpoint nothing is loaded or registered and spans stay the API's no-ops.
 * Disposing flushes what is left.
 */
export async function startRoleTracing(
  role: string,
  env: Readonly<Record<string, string | undefined>>,
  logger: Logger,
): Promise<AsyncDisposable> {
  const endpoint = tracesEndpoint(env);
  if (!endpoint) return { [Symbol.asyncDispose]: async () => {} };
  // Loaded only when asked for: every other run of the CLI starts without the SDK.
  const [{ trace }, { OTLPTraceExporter }, { resourceFromAttributes }, { BatchSpanProcessor, TracerProvider }] = await Promise.all([
    import("@opentelemetry/api"),
    import("@opentelemetry/exporter-trace-otlp-http"),
    import("@opentelemetry/resources"),
    import("@opentelemetry/sdk-trace"),
  ]);
  const sampling = traceSampling(env);
  const { AlwaysOffSampler, AlwaysOnSampler, ParentBasedSampler, TraceIdRatioBasedSampler } = await import("@opentelemetry/sdk-trace");
  const root = sampling.off
    ? new AlwaysOffSampler()
    : sampling.ratio === undefined
      ? new AlwaysOnSampler()
      : new TraceIdRatioBasedSampler(sampling.ratio);
  const sampler = sampling.parentBased ? new ParentBasedSampler({ root }) : root;
  const provider = new TracerProvider({
    sampler,
    resource: resourceFromAttributes({ "service.name": role }),
    spanProcessors: [new BatchSpanProcessor({ exporter: new OTLPTraceExporter() })],
  });
  trace.setGlobalTracerProvider(provider);
  logger.info({ endpoint, sampler: sampling.name }, "traces are exported over OTLP");
  return { [Symbol.asyncDispose]: () => provider.shutdown().catch(() => undefined) };
}

/** The sampler OpenTelemetry's standard variables name: which traces a role keeps. */
export interface TraceSampling {
  name: string;
  /** Begin none (a parent-based one still follows a sampled caller). */
  off?: boolean;
  /** Follow the sampled flag of a trace begun elsewhere (the caller's), and sample only new ones. */
  parentBased: boolean;
  /** The share of new traces kept (0 to 1); absent: all. */
  ratio?: number;
}

const SAMPLERS = ["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"];

/**
 * `OTEL_TRACES_SAMPLER` (default `parentbased_always_on`: every trace) and, for the ratio
 * samplers, `OTEL_TRACES_SAMPLER_ARG` (the share kept, 0 to 1; default 1). A value that is not
 * one of them is an error naming the variable.
 */
export function traceSampling(env: Readonly<Record<string, string | undefined>>): TraceSampling {
  const name = env.OTEL_TRACES_SAMPLER || "parentbased_always_on";
  if (!SAMPLERS.includes(name)) {
    throw new UsageError(`OTEL_TRACES_SAMPLER is ${JSON.stringify(name)}: use one of ${SAMPLERS.join(", ")}`);
  }
  const parentBased = name.startsWith("parentbased_");
  if (name.endsWith("always_off")) return { name, off: true, parentBased };
  if (!name.endsWith("traceidratio")) return { name, parentBased };
  const arg = env.OTEL_TRACES_SAMPLER_ARG;
  const ratio = arg === undefined || arg === "" ? 1 : Number(arg);
  if (!Number.isFinite(ratio) || ratio < 0 || ratio > 1) {
    throw new UsageError(`OTEL_TRACES_SAMPLER_ARG is ${JSON.stringify(arg)}: give the share of traces kept, from 0 to 1`);
  }
  return { name, parentBased, ratio };
}
