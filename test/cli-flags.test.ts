/**
 * Rough edges of the command line (issue 45): every command's help lists the flags every command
 * takes, and a negative duration gets the same clear error however it is written. Against a real
 * nats-server and dispatcher.
 */

import { startDispatcher } from "@boxcar/dispatcher";
import { natsFixture } from "@boxcar/testing";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

test("each command's --help lists the connection flags every command takes", async () => {
  for (const command of ["worker", "dispatcher", "submit", "session"]) {
    const help = await boxcar("nats://127.0.0.1:1", "boxcar", [command, "--help"]);
    expect(help.code, command).toBe(0);
    for (const flag of ["--creds", "--nkey", "--context", "--tls-cert", "--tls-ca", "--nats"])
      expect(help.stdout, `${command} ${flag}`).toContain(flag);
  }
});

test("a negative duration is refused naming the field, written --delay -5s as --delay=-5s", async () => {
  await using nats = await natsFixture();
  await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  const prefix = nats.topology.names.prefix;
  await boxcar(nats.url, prefix, ["agent", "apply", "-f", "examples/agents/hello.yaml"]);
  const spaced = await boxcar(nats.url, prefix, ["submit", "hello", "--delay", "-5s"]);
  const joined = await boxcar(nats.url, prefix, ["submit", "hello", "--delay=-5s"]);
  expect(joined.code).toBe(3);
  expect(joined.stderr).toContain("delay");
  expect(spaced).toEqual(joined);
});

test("a trace URL without {traceId}, or not http(s), is a usage error naming where it came from (the flag or the variable)", async () => {
  const bad = await boxcar("nats://127.0.0.1:1", "boxcar", [
    "ui",
    "--nats-ws",
    "ws://127.0.0.1:1",
    "--listen",
    "127.0.0.1:0",
    "--trace-url",
    "ftp://x/{traceId}",
  ]);
  expect(bad.code).toBe(2);
  expect(bad.stderr).toContain("--trace-url: a trace URL is an http(s) address with {traceId} in it");
  const fromEnv = await boxcar("nats://127.0.0.1:1", "boxcar", ["ui", "--nats-ws", "ws://127.0.0.1:1", "--listen", "127.0.0.1:0"], {
    BOXCAR_TRACE_URL: "http://jaeger/trace/",
  });
  expect(fromEnv.code).toBe(2);
  expect(fromEnv.stderr).toContain("$BOXCAR_TRACE_URL: a trace URL");
});
