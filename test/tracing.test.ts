import { TRACEPARENT, traceparentOf } from "@boxcar/common";
import { eventually, localSystem } from "@boxcar/testing";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { afterAll, beforeAll, expect, test } from "vitest";

const exporter = new InMemorySpanExporter();

// An application's SDK, in this process: every role here (client, dispatcher, worker) reports to it.
beforeAll(() => {
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
});
afterAll(() => {
  trace.disable();
  context.disable();
});

const parentOf = (span: ReadableSpan) => span.parentSpanContext?.spanId;

test("one trace from the submitter's span through the dispatcher, the worker, a handoff and the agents' TRACEPARENT", async () => {
  await using system = await localSystem();
  const { client } = system;
  // Each agent reports the TRACEPARENT it was given; the first hands off to the second.
  const report = 'printf \'{"output":"%s"%s}\' "$TRACEPARENT" "$1" > "$BOXCAR_RESULT_FILE"';
  await client.applyAgent({
    name: "first",
    command: ["bash", "-c", report, "_", ',"handoff":{"to":"second"}'],
    handoffs: ["second"],
    trusted: true,
    runtime: { sandbox: "host" },
  });
  await client.applyAgent({ name: "second", command: ["bash", "-c", report, "_", ""], trusted: true, runtime: { sandbox: "host" } });

  const tracer = trace.getTracer("test");
  const { root, first, last } = await tracer.startActiveSpan("user.request", async (span) => {
    const { job } = await client.submit({ agent: "first" });
    const end = await client.waitForChain(job.id);
    span.end();
    return { root: span.spanContext(), first: await client.getJob(job.id), last: end };
  });
  expect([first.agent, last.agent, last.state]).toEqual(["first", "second", "succeeded"]);

  // The attempts' spans end once their jobs are settled: wait for both.
  const spans = await eventually(async () => {
    const all = exporter.getFinishedSpans();
    return all.filter((s) => s.name === "job.attempt").length === 2 ? all : undefined;
  }, "both attempts' spans");
  const named = (name: string, jobId?: string) =>
    spans.filter((s) => s.name === name && (jobId === undefined || s.attributes["boxcar.job.id"] === jobId));
  const [submit] = named("jobs.submit");
  const [firstAttempt] = named("job.attempt", first.id);
  const [handoff] = named("handoff", first.id);
  const [lastAttempt] = named("job.attempt", last.id);
  for (const span of [submit, firstAttempt, handoff, lastAttempt]) expect(span?.spanContext().traceId).toBe(root.traceId);

  // Parent by parent: the request's span under the user's, the first attempt and the handoff
  // under the admission (the job record's trace), the next job's attempt under the handoff.
  expect(parentOf(submit!)).toBe(root.spanId);
  expect(submit?.attributes).toMatchObject({ "messaging.system": "nats", "boxcar.job.id": first.id });
  expect(parentOf(firstAttempt!)).toBe(submit?.spanContext().spanId);
  expect(firstAttempt?.attributes).toMatchObject({
    "messaging.operation.type": "process",
    "boxcar.agent": "first",
    "boxcar.attempt": 1,
    "boxcar.sandbox.kind": "host",
    "boxcar.job.state": "succeeded",
  });
  expect(parentOf(handoff!)).toBe(submit?.spanContext().spanId);
  expect(parentOf(lastAttempt!)).toBe(handoff?.spanContext().spanId);

  // Each agent got its attempt's span as TRACEPARENT, so its own spans (an LLM call) join the trace.
  expect(first.result?.output).toBe(`00-${root.traceId}-${firstAttempt?.spanContext().spanId}-01`);
  expect(last.result?.output).toBe(`00-${root.traceId}-${lastAttempt?.spanContext().spanId}-01`);
  expect(first.traceparent).toBe(`00-${root.traceId}-${submit?.spanContext().spanId}-01`);
});

test("a workflow run's jobs join the trace of the request that started it", async () => {
  exporter.reset();
  await using system = await localSystem();
  const { client } = system;
  await client.applyAgent({ name: "step", command: "true", trusted: true, runtime: { sandbox: "host" } });
  const tracer = trace.getTracer("test");
  const { root, run } = await tracer.startActiveSpan("user.request", async (span) => {
    const { run } = await client.startRun({
      workflow: {
        name: "traced",
        steps: [
          { name: "a", agent: "step" },
          { name: "b", agent: "step", needs: ["a"] },
        ],
      },
    });
    const ended = await client.waitForRun(run.id);
    span.end();
    return { root: span.spanContext(), run: ended };
  });
  expect(run.state).toBe("succeeded");
  const jobs = Object.values(run.steps).flatMap((s) => s.instances.flatMap((i) => i.jobs));
  expect(jobs).toHaveLength(2);
  const spans = await eventually(async () => {
    const all = exporter.getFinishedSpans();
    return all.filter((s) => s.name === "job.attempt").length === 2 ? all : undefined;
  }, "both steps' attempt spans");
  const [start] = spans.filter((s) => s.name === "workflows.start");
  expect(start?.attributes["boxcar.run.id"]).toBe(run.id);
  expect([start?.spanContext().traceId, parentOf(start!)]).toEqual([root.traceId, root.spanId]);
  for (const jobId of jobs) {
    const [attempt] = spans.filter((s) => s.name === "job.attempt" && s.attributes["boxcar.job.id"] === jobId);
    expect([attempt?.spanContext().traceId, parentOf(attempt!)], jobId).toEqual([root.traceId, start?.spanContext().spanId]);
  }
});

test("a job submitted on the durable intake stream joins the trace its message carries", async () => {
  exporter.reset();
  await using system = await localSystem();
  const { client, nats } = system;
  await client.applyAgent({ name: "taken-in", command: "true", trusted: true, runtime: { sandbox: "host" } });
  const tracer = trace.getTracer("test");
  const root = await tracer.startActiveSpan("user.publish", async (span) => {
    const headers = natsHeaders();
    headers.set(TRACEPARENT, traceparentOf() ?? "");
    await nats.topology.js.publish(nats.topology.names.subjects.submit("local", "taken-in"), JSON.stringify({ input: 1 }), { headers });
    span.end();
    return span.spanContext();
  });
  const spans = await eventually(async () => {
    const all = exporter.getFinishedSpans();
    return all.some((s) => s.name === "job.attempt") ? all : undefined;
  }, "the attempt's span");
  const intake = spans.find((s) => s.name === "intake");
  const attempt = spans.find((s) => s.name === "job.attempt");
  expect([intake?.spanContext().traceId, parentOf(intake!)]).toEqual([root.traceId, root.spanId]);
  expect(intake?.attributes["boxcar.job.id"]).toBe(attempt?.attributes["boxcar.job.id"]);
  expect([attempt?.spanContext().traceId, parentOf(attempt!)]).toEqual([root.traceId, intake?.spanContext().spanId]);
});

test("an attempt's phases are spans under it, and its wait in the queue one before it: where a job's time went", async () => {
  await using system = await localSystem();
  const { client } = system;
  await client.applyAgent({
    name: "phased",
    command: ["sh", "-c", "sleep 0.3; mkdir -p out; echo kept > out/a.txt"],
    trusted: true,
    runtime: { sandbox: "host" },
  });
  const { job } = await client.submit({ agent: "phased", delay: "1s" });
  expect((await client.waitForJob(job.id)).state).toBe("succeeded");
  const spans = await eventually(async () => {
    const all = exporter.getFinishedSpans().filter((s) => s.attributes["boxcar.job.id"] === job.id);
    return all.some((s) => s.name === "job.attempt") && all.some((s) => s.name === "sandbox.destroy") ? all : undefined;
  }, "the attempt's spans");
  const one = (name: string) => {
    const found = spans.filter((s) => s.name === name);
    expect(found, name).toHaveLength(1);
    return found[0] as ReadableSpan;
  };
  const attempt = one("job.attempt");
  const queued = one("job.queued");
  const ms = (t: [number, number]) => t[0] * 1000 + t[1] / 1e6;
  // The wait: from when the job was due (its delay) to its claim, beside the attempt in the job's trace.
  expect(parentOf(queued)).toBe(parentOf(attempt));
  expect(ms(queued.endTime)).toBeLessThanOrEqual(ms(attempt.startTime) + 5);
  const phases = ["sandbox.create", "workspace.prepare", "agent.run", "artifacts.store", "sandbox.destroy"].map(one);
  for (const phase of phases) {
    expect(parentOf(phase), phase.name).toBe(attempt.spanContext().spanId);
    expect(phase.spanContext().traceId).toBe(attempt.spanContext().traceId);
  }
  // In order, and the run holds the agent's 300 ms.
  for (let i = 1; i < phases.length; i++) {
    expect(ms((phases[i] as ReadableSpan).startTime)).toBeGreaterThanOrEqual(ms((phases[i - 1] as ReadableSpan).endTime) - 1);
  }
  const run = phases[2] as ReadableSpan;
  expect(ms(run.endTime) - ms(run.startTime)).toBeGreaterThanOrEqual(300);
});

test("a read begins no trace of its own (a follower's polling, a dashboard's reloads); within a caller's trace it is traced", async () => {
  await using system = await localSystem();
  const { client } = system;
  await client.applyAgent({ name: "quiet", command: "true", trusted: true, runtime: { sandbox: "host" } });
  const { job } = await client.submit({ agent: "quiet" });
  await client.waitForJob(job.id);
  exporter.reset();
  await client.getJob(job.id);
  await client.listJobs({ agent: "quiet" });
  const traced = await trace.getTracer("test").startActiveSpan("user.look", async (span) => {
    await client.getJob(job.id);
    span.end();
    return span.spanContext();
  });
  const reads = () => exporter.getFinishedSpans().filter((s) => s.name === "jobs.get" || s.name === "jobs.list");
  const [inTrace] = await eventually(async () => (reads().length > 0 ? reads() : undefined), "the traced read's span");
  expect(reads()).toHaveLength(1);
  expect(inTrace?.spanContext().traceId).toBe(traced.traceId);
  expect(parentOf(inTrace as ReadableSpan)).toBe(traced.spanId);
});
