import type { Logger } from "@boxcar/common";

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
 * other `OTEL_EXPORTER_OTLP_*` settings (headers, timeout) itself. Every trace is kept (no
 * sampling). Without an endpoint nothing is loaded or registered and spans stay the API's no-ops.
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
  const provider = new TracerProvider({
    resource: resourceFromAttributes({ "service.name": role }),
    spanProcessors: [new BatchSpanProcessor({ exporter: new OTLPTraceExporter() })],
  });
  trace.setGlobalTracerProvider(provider);
  logger.info({ endpoint }, "traces are exported over OTLP");
  return { [Symbol.asyncDispose]: () => provider.shutdown().catch(() => undefined) };
}
