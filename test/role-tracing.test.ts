import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { createClient } from "@boxcar/client";
import { eventually, natsFixture } from "@boxcar/testing";
import { expect, test } from "vitest";
import { exited, spawnBoxcar } from "./helpers/cli.js";

/** A span as OTLP/JSON carries it, with the service that sent it. */
interface ReceivedSpan {
  service: string;
  name: string;
  traceId: string;
  spanId: string;
  parentSpanId?: string;
}

/** An OTLP/HTTP receiver for traces: keeps every span posted to /v1/traces. */
async function otlpReceiver() {
  const spans: ReceivedSpan[] = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (chunk: Buffer) => (body += chunk.toString()));
    req.on("end", () => {
      if (req.url === "/v1/traces" && req.method === "POST") {
        const data = JSON.parse(body) as {
          resourceSpans: {
            resource: { attributes: { key: string; value: { stringValue?: string } }[] };
            scopeSpans: { spans: Omit<ReceivedSpan, "service">[] }[];
          }[];
        };
        for (const rs of data.resourceSpans) {
          const service = rs.resource.attributes.find((a) => a.key === "service.name")?.value.stringValue ?? "";
          for (const ss of rs.scopeSpans) for (const s of ss.spans) spans.push({ ...s, service });
        }
      }
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    spans,
    [Symbol.asyncDispose]: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

test("boxcar dispatcher and worker export their spans over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set; agents get an endpoint when the worker names one", async () => {
  await using nats = await natsFixture();
  await using receiver = await otlpReceiver();
  const prefix = nats.topology.names.prefix;
  const env = { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_BSP_SCHEDULE_DELAY: "100" };
  const dispatcher = spawnBoxcar(nats.url, prefix, ["dispatcher"], env);
  // Agents are given an endpoint only when the worker is told which (--agent-traces).
  const worker = spawnBoxcar(nats.url, prefix, ["worker", "--host", "always", "--agent-traces", receiver.url], env);
  try {
    const client = createClient(nats.topology);
    await eventually(async () => ((await client.listWorkers().catch(() => [])).length > 0 ? true : undefined), "the worker to start");
    await client.applyAgent({
      name: "traced",
      command: [
        "bash",
        "-c",
        'printf \'{"output":{"endpoint":"%s","traceparent":"%s"}}\' "$OTEL_EXPORTER_OTLP_ENDPOINT" "$TRACEPARENT" > "$BOXCAR_RESULT_FILE"',
      ],
      trusted: true,
      runtime: { sandbox: "host" },
    });
    const { job } = await client.submit({ agent: "traced" });
    const final = await client.waitForJob(job.id);
    expect(final.state).toBe("succeeded");
    const output = final.result?.output as { endpoint: string; traceparent: string };
    expect(output.endpoint).toBe(receiver.url);

    const submit = await eventually(
      async () => receiver.spans.find((s) => s.service === "boxcar-dispatcher" && s.name === "jobs.submit"),
      "the dispatcher's jobs.submit span",
    );
    const attempt = await eventually(
      async () => receiver.spans.find((s) => s.service === "boxcar-worker" && s.name === "job.attempt" && s.traceId === submit.traceId),
      "the worker's job.attempt span, in the same trace",
    );
    expect(attempt.parentSpanId).toBe(submit.spanId);
    // The agent was given its attempt's span as its parent.
    expect(output.traceparent).toBe(`00-${attempt.traceId}-${attempt.spanId}-01`);
  } finally {
    dispatcher.kill("SIGTERM");
    worker.kill("SIGTERM");
    await Promise.all([exited(dispatcher), exited(worker)]);
  }
});
