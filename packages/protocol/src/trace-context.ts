import { z } from "zod";

/** A W3C trace context (`traceparent`, version 00): the trace a job or run belongs to (docs/observability.md). */
export const Traceparent = z
  .string()
  .regex(/^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/, "a W3C traceparent: 00-<trace id>-<span id>-<flags>");
