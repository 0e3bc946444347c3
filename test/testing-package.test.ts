/**
 * The example of packages/testing/README.md, run as it is written there: a user's own agent tested
 * against a local system. Keep the two the same.
 */

import { readFile } from "node:fs/promises";

// --- the README's example, from here ---
import { localSystem } from "@boxcar/testing";
import { expect, test } from "vitest";

/** The agent under test: it greets the name in its input (any command reading the agent contract would do). */
const GREETER = `
const fs = require("node:fs");
const { name } = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8"));
console.log("greeting " + name);
fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: { greeting: "Hello, " + name + "!" } }));
`;

test("the greeter greets the name it is given", async () => {
  // A nats-server, a dispatcher, a worker and a client, in this process; all stopped at the end of the test.
  await using system = await localSystem();
  const { client } = system;
  await client.applyAgent({
    name: "greeter",
    command: ["node", "-e", GREETER],
    trusted: true, // it may run on the host: the test's own machine
    runtime: { sandbox: "host", timeout: "30s" },
  });

  const { job } = await client.submit({ agent: "greeter", input: { name: "Ada" } });
  const done = await client.waitForJob(job.id);

  expect(done.state).toBe("succeeded");
  expect(done.result?.output).toEqual({ greeting: "Hello, Ada!" });
  let printed = "";
  for await (const chunk of client.logs(job.id)) printed += new TextDecoder().decode(chunk.data);
  expect(printed).toContain("greeting Ada");
}, 60_000);
// --- to here ---

test("a job whose agent fails ends failed, with its exit code, once its attempts are spent", async () => {
  await using system = await localSystem();
  await system.client.applyAgent({
    name: "broken",
    command: ["sh", "-c", "echo cannot >&2; exit 3"],
    trusted: true,
    runtime: { sandbox: "host", timeout: "30s" },
    retry: { maxAttempts: 1 },
  });
  const { job } = await system.client.submit({ agent: "broken", input: {} });
  const done = await system.client.waitForJob(job.id);
  expect(done).toMatchObject({ state: "failed", attempt: 1, result: { exitCode: 3 } });
}, 60_000);

test("packages/testing/README.md shows the example above as it is written here", async () => {
  const source = await readFile(new URL(import.meta.url), "utf8");
  const example = source.split("// --- the README's example, from here ---\n")[1]?.split("// --- to here ---")[0];
  const readme = await readFile(new URL("../packages/testing/README.md", import.meta.url), "utf8");
  const shown = readme.split("<!-- the example of test/testing-package.test.ts -->\n```ts\n")[1]?.split("```")[0];
  expect(example).toContain("localSystem()");
  expect(shown).toBe(example);
});
