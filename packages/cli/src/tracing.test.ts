import { silentLogger } from "@boxcar/common";
import { trace } from "@opentelemetry/api";
import { afterEach, expect, test } from "vitest";
import { startRoleTracing, traceSampling } from "./tracing.js";

afterEach(() => trace.disable());

test("the standard sampler variables: every trace by default, a share of new ones, none; a bad value names its variable", () => {
  expect(traceSampling({})).toEqual({ name: "parentbased_always_on", parentBased: true });
  expect(traceSampling({ OTEL_TRACES_SAMPLER: "parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG: "0.1" })).toEqual({
    name: "parentbased_traceidratio",
    parentBased: true,
    ratio: 0.1,
  });
  expect(traceSampling({ OTEL_TRACES_SAMPLER: "always_off" })).toMatchObject({ off: true, parentBased: false });
  expect(() => traceSampling({ OTEL_TRACES_SAMPLER: "sometimes" })).toThrow(/OTEL_TRACES_SAMPLER is "sometimes": use one of/);
  expect(() => traceSampling({ OTEL_TRACES_SAMPLER: "traceidratio", OTEL_TRACES_SAMPLER_ARG: "2" })).toThrow(
    /OTEL_TRACES_SAMPLER_ARG is "2"/,
  );
});

test("a role's tracer keeps or drops new traces as its sampler says", async () => {
  const recording = async (env: Record<string, string>) => {
    const role = await startRoleTracing("test-role", { OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:9", ...env }, silentLogger);
    const span = trace.getTracer("t").startSpan("s");
    const kept = span.isRecording();
    // Not ended: nothing to export to the address nobody listens on.
    trace.disable();
    await role[Symbol.asyncDispose]();
    return kept;
  };
  expect(await recording({})).toBe(true);
  expect(await recording({ OTEL_TRACES_SAMPLER: "traceidratio", OTEL_TRACES_SAMPLER_ARG: "0" })).toBe(false);
  expect(await recording({ OTEL_TRACES_SAMPLER: "always_off" })).toBe(false);
});
