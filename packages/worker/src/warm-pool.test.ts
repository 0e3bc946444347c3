import { spawnSync } from "node:child_process";
import { expect, test } from "vitest";
import { jobScript, ReportScanner, WARM_COMMAND } from "./warm-pool.js";

/** Runs a job script the way a warm container does: the helper command, the script on stdin. */
function runScript(argv: string[], env: Record<string, string>, nonce: string) {
  const [sh, ...args] = WARM_COMMAND as [string, ...string[]];
  const result = spawnSync(sh, args, { input: jobScript(argv, env, nonce), env: {} });
  return { stdout: result.stdout.toString(), stderr: result.stderr.toString() };
}

test("a job script passes argv and environment through exactly, whatever they hold, and reports the exit code on both streams", () => {
  const tricky = `it's "quoted" $HOME \`id\` $(id) \\ ; & | * \n second line`;
  const { stdout, stderr } = runScript(
    ["/bin/sh", "-c", 'printf "%s|%s|%s" "$1" "$TRICKY" "$EMPTY"; echo err >&2; exit 7', "agent", tricky],
    { TRICKY: tricky, EMPTY: "" },
    "n0nce",
  );
  expect(stdout).toBe(`${tricky}|${tricky}|\nn0nce 7 0\n`);
  expect(stderr).toBe("err\n\nn0nce 7 0\n");
});

test("the agent's stdin is empty, as in a cold container", () => {
  const { stdout } = runScript(["/bin/sh", "-c", "wc -c"], {}, "n");
  expect(stdout.trim().split("\n")[0]?.trim()).toBe("0");
});

test("a name that is not a shell name is refused, not run", () => {
  expect(() => jobScript(["true"], { "BAD;rm": "x" }, "n")).toThrow(/not a shell name/);
});

test("the report is found across chunk boundaries; the agent's output before it passes whole", () => {
  const nonce = "boxcar-exit-abc";
  const stream = `line one\nlast without newline\n${nonce} 137 2\n`;
  for (let cut = 1; cut < stream.length; cut++) {
    const scanner = new ReportScanner(nonce);
    const out = Buffer.concat([scanner.take(Buffer.from(stream.slice(0, cut))), scanner.take(Buffer.from(stream.slice(cut)))]);
    expect(out.toString()).toBe("line one\nlast without newline");
    expect(scanner.report).toEqual({ exitCode: 137, oomKills: 2 });
  }
});

test("output that only looks like the start of a report is passed on when the stream ends without one", () => {
  const scanner = new ReportScanner("boxcar-exit-abc");
  const passed = scanner.take(Buffer.from("text\nboxcar-exit-ab"));
  expect(passed.toString()).toBe("text");
  expect(scanner.rest().toString()).toBe("\nboxcar-exit-ab");
  expect(scanner.report).toBeUndefined();
});
