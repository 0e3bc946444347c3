import { startNatsServer } from "@boxcar/fabric";
import { expect, test } from "vitest";
import { boxcar, eventually, exited, spawnBoxcar } from "./helpers/cli.js";
import { uniquePrefix } from "./helpers/nats.js";

// A real nats-server whose JetStream may keep 48 MiB on disk: less than the 1.75 GiB Boxcar's
// history streams reserve by default.
test("on a server with too little JetStream storage, a role says so in one line; with smaller stream limits the system runs", async () => {
  await using server = await startNatsServer({ maxFileStore: 48 * 1024 ** 2 });
  const prefix = uniquePrefix();

  const refused = await boxcar(server.url, prefix, ["dispatcher"]);
  expect(refused.code).toBe(3);
  expect(refused.stderr).toContain("storage_full: JetStream has less file storage free than Boxcar's streams reserve");
  expect(refused.stderr).toContain("--stream-limits");
  expect(refused.stderr).not.toMatch(/^\s+at /m); // no stack trace
  expect(refused.stderr.trim().split("\n")).toHaveLength(1);

  const badFlag = await boxcar(server.url, prefix, ["dispatcher", "--stream-limits", "events=8Mi,log=8Mi"]);
  expect(badFlag.code).toBe(2);
  expect(badFlag.stderr).toContain('"log" is not a stream with a limit; use events, logs or dead');

  // The first role makes the streams with the limits it is given (here from the environment);
  // later roles find them made.
  const dispatcher = spawnBoxcar(server.url, prefix, ["dispatcher"], { BOXCAR_STREAM_LIMITS: "events=8Mi,logs=8Mi,dead=4Mi" });
  await eventually(async () => (dispatcher.output().includes("dispatcher started") ? true : undefined), "the dispatcher");
  const worker = spawnBoxcar(server.url, prefix, ["worker"]);
  try {
    await eventually(
      async () => ((await boxcar(server.url, prefix, ["workers"])).stdout.includes("live") ? true : undefined),
      "the worker",
    );
    const applied = await boxcar(server.url, prefix, ["agent", "apply", "-f", "examples/agents/hello.yaml"]);
    expect(applied.code, applied.stderr).toBe(0);
    const run = await boxcar(server.url, prefix, ["submit", "hello", "--input", '{"name":"small"}', "--wait"]);
    expect(run.code, run.stderr).toBe(0);
    expect(run.stdout).toContain("succeeded");
  } finally {
    dispatcher.kill("SIGTERM");
    worker.kill("SIGTERM");
    await Promise.all([exited(dispatcher), exited(worker)]);
  }
}, 90_000);
