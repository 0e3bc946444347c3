import {
  type Attributes,
  type Context,
  context,
  INVALID_SPAN_CONTEXT,
  isSpanContextValid,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from "@opentelemetry/api";

/**
 * Tracing with OpenTelemetry's API only: spans go to whatever tracer provider the process has
 * registered (an application's SDK, a test's in-memory exporter), and cost next to nothing when
 * none is. A job's trace context travels as a W3C `traceparent`, in NATS headers (a request to
 * the API, a work item) and in the job record (`traceparent`), so the dispatcher, the worker, the
 * jobs a handoff starts and the agent itself (`TRACEPARENT`) join the submitter's trace.
 *
 * Boxcar writes and reads `traceparent` itself rather than through the registered propagator:
 * it is carried whether or not the application configured one.
 */
export const TRACEPARENT = "traceparent";

const VERSION = "0.1.0";

function tracer(): Tracer {
  return trace.getTracer("boxcar", VERSION);
}

/** The W3C `traceparent` of the span in `ctx`, or undefined when there is none worth carrying. */
export function traceparentOf(ctx: Context = context.active()): string | undefined {
  const span = trace.getSpanContext(ctx);
  if (!span || !isSpanContextValid(span)) return undefined;
  return `00-${span.traceId}-${span.spanId}-${(span.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
}

const TRACEPARENT_PATTERN = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** A context whose parent is the remote span `traceparent` names; the active context when it names none. */
function contextFrom(traceparent: string | undefined): Context {
  const match = traceparent ? TRACEPARENT_PATTERN.exec(traceparent.trim()) : null;
  if (!match) return context.active();
  const [, traceId, spanId, flags] = match as unknown as [string, string, string, string];
  const span = { traceId, spanId, traceFlags: Number.parseInt(flags, 16), isRemote: true };
  return isSpanContextValid(span) ? trace.setSpanContext(context.active(), span) : context.active();
}

/**
 * Starts a span named `name`, child of the remote span `parent` names (a `traceparent`; none:
 * a new trace, when a tracer provider is registered), and gives its own `traceparent` to pass
 * on. The caller ends the span.
 */
export function startSpan(
  name: string,
  parent: string | undefined,
  opts: { kind: SpanKind; attributes?: Attributes; startTime?: number },
): { span: Span; traceparent: string | undefined } {
  const parentContext = contextFrom(parent);
  const span = tracer().startSpan(name, opts, parentContext);
  return { span, traceparent: traceparentOf(trace.setSpan(parentContext, span)) };
}

/** A span that records nothing: for work no trace is kept for. */
export const NOT_TRACED: Span = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);

/** Ends `span` as failed with `err`'s message (and `code`, Boxcar's error code, when known). */
export function failSpan(span: Span, err: { message: string; code?: string }): void {
  if (err.code) span.setAttribute("boxcar.error.code", err.code);
  span.setStatus({ code: SpanStatusCode.ERROR, message: err.message });
}

export { type Span, SpanKind };
