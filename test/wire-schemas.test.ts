import { readStream } from "@boxcar/fabric";
import { jsonSchemas } from "@boxcar/protocol";
import { Ajv2020 } from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { expect, test } from "vitest";
import { localSystem } from "./helpers/system.js";

/**
 * The published JSON Schemas of what Boxcar stores and sends (schemas/*.schema.json) hold for
 * what a real system writes: a client in another language can validate against them.
 */
test("records, work items, events, worker entries and workflow runs a real system writes match their published JSON Schemas", async () => {
  await using system = await localSystem();
  const { client, nats, worker } = system;
  const { topology } = nats;
  const ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats.default(ajv);
  const schemas = jsonSchemas();
  const check = (file: string, value: unknown, what: string) => {
    const validate = ajv.compile(schemas[file] as object);
    expect(validate(value) ? [] : validate.errors, `${what} against ${file}`).toEqual([]);
  };

  await client.applyAgent({
    name: "echo",
    command: [
      "bash",
      "-c",
      'echo hi > out/note.txt; printf \'{"output":%s,"summary":"ok"}\' "$(cat "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"',
    ],
    trusted: true,
    runtime: { sandbox: "host", timeout: "30s" },
  });
  await client.applyAgent({ name: "fails", command: ["bash", "-c", "exit 3"], trusted: true, runtime: { sandbox: "host" } });
  // A pool no worker serves: its job's work item stays in the stream to be read.
  await client.applyAgent({ name: "waits", command: "true", trusted: true, pool: "nobody", runtime: { sandbox: "host" } });

  const ok = await client.waitForJob((await client.submit({ agent: "echo", input: { n: 1 } })).job.id);
  const failed = await client.waitForJob((await client.submit({ agent: "fails" })).job.id);
  const waiting = (await client.submit({ agent: "waits", input: { big: "x".repeat(1000) } })).job;
  const { run } = await client.startRun({
    workflow: {
      name: "pair",
      steps: [
        { name: "a", agent: "echo" },
        { name: "b", agent: "echo", needs: ["a"], input: "{{ steps.a.output }}" },
      ],
    },
    input: 5,
  });
  const ended = await client.waitForRun(run.id);
  expect([ok.state, failed.state, ended.state]).toEqual(["succeeded", "failed", "succeeded"]);

  for (const id of [ok.id, failed.id, waiting.id]) check("job-record.schema.json", (await topology.jobs.get(id))?.json(), `job ${id}`);
  const item = await topology.jsm.streams.getMessage(topology.names.streams.work, {
    last_by_subj: topology.names.subjects.work(waiting.pool, waiting.priority),
  });
  check("work-item.schema.json", item?.json(), "a work item");
  let events = 0;
  for await (const msg of readStream(topology, topology.names.streams.events, `${topology.names.prefix}.evt.>`)) {
    check("event.schema.json", msg.json(), msg.subject);
    events += 1;
  }
  expect(events).toBeGreaterThan(10);
  check("worker.schema.json", (await topology.workers.get(worker.id))?.json(), "the worker's presence");
  check("workflow-run.schema.json", (await topology.workflows.get(run.id))?.json(), "the workflow run");

  // And they are not so loose that anything passes.
  const validate = ajv.compile(schemas["job-record.schema.json"] as object);
  expect(validate({ ...(await topology.jobs.get(ok.id))?.json<object>(), state: "finished" })).toBe(false);
});
