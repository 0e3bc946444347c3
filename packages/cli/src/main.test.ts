import { readFileSync } from "node:fs";
import { PassThrough } from "node:stream";
import { expect, test } from "vitest";
import { COMMANDS } from "./command-table.js";
import { main } from "./main.js";

/** Runs `boxcar ARGV` in this process; what it printed and its exit code. */
async function boxcar(...argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = { stdout: "", stderr: "" };
  const stream = (key: keyof typeof out) =>
    new PassThrough().on("data", (chunk: Buffer) => {
      out[key] += chunk.toString();
    });
  const code = await main(argv, { stdout: stream("stdout"), stderr: stream("stderr"), env: {}, signal: new AbortController().signal });
  return { code, ...out };
}

test("boxcar --version prints the CLI package's version", async () => {
  const { version } = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string };
  expect(await boxcar("--version")).toEqual({ code: 0, stdout: `boxcar ${version}\n`, stderr: "" });
});

test("each command of the table runs its own module: its --help shows its usage and the table's summary", async () => {
  for (const { name, summary } of COMMANDS) {
    const help = await boxcar(name, "--help");
    expect(help.code, name).toBe(0);
    expect(help.stdout, name).toMatch(new RegExp(`^usage: boxcar ${name}[ \n]`));
    expect(help.stdout, name).toContain(`\n\n${summary}\n\n`);
  }
});
