import { spawn } from "node:child_process";
import { expect, test } from "vitest";
import { jobScript, ReportScanner, warmCommand } from "./warm-pool.js";

const END = "boxcar-script-end-test";

/**
 * Runs a job script the way a warm container does: the helper command, the script on stdin up
 * to its end line, stdin kept open (the lifeline) until the helper exits, unless `cutAfterMs`
 * (the worker gone). Its own process group, as a container's: the sentinel kills its group.
 */
function runScript(argv: string[], env: Record<string, string>, nonce: string, opts: { cutAfterMs?: number; input?: string } = {}) {
  const [sh, ...args] = warmCommand(END) as [string, ...string[]];
  const child = spawn(sh, args, { env: {}, detached: true, stdio: ["pipe", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c: Buffer) => (stdout += c.toString()));
  child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
  child.stdin.write(opts.input ?? `${jobScript(argv, env, nonce)}${END}\n`);
  const cut = opts.cutAfterMs === undefined ? undefined : setTimeout(() => child.stdin.end(), opts.cutAfterMs);
  return new Promise<{ stdout: string; stderr: string; code: number | null; signal: string | null }>((resolve) =>
    child.on("close", (code, signal) => {
      clearTimeout(cut);
      child.stdin.destroy();
      resolve({ stdout, stderr, code, signal });
    }),
  );
}

test("a job script passes argv and environment through exactly, whatever they hold, and reports the exit code on both streams", async () => {
  const tricky = `it's "quoted" $HOME \`id\` $(id) \\ ; & | * \n second line`;
  const { stdout, stderr } = await runScript(
    ["/bin/sh", "-c", 'printf "%s|%s|%s" "$1" "$TRICKY" "$EMPTY"; echo err >&2; exit 7', "agent", tricky],
    { TRICKY: tricky, EMPTY: "" },
    "n0nce",
  );
  expect(stdout).toBe(`${tricky}|${tricky}|\u001en0nce 7\n`);
  expect(stderr).toBe("err\n\u001en0nce 7\n");
});

test("the agent's command is looked up on PATH as in a cold container, never a shell built-in", async () => {
  // dash's own echo would turn \t into a tab; coreutils' prints it as it is.
  const { stdout } = await runScript(["echo", "a\\tb"], { PATH: "/usr/bin:/bin" }, "n");
  expect(stdout.split("\n")[0]).toBe("a\\tb");
});

test("the agent's stdin is empty, as in a cold container", async () => {
  const { stdout } = await runScript(["/bin/sh", "-c", "wc -c"], {}, "n");
  expect(stdout.trim().split("\n")[0]?.trim()).toBe("0");
});

test("the agent dies with its lifeline: stdin ending mid-run (the worker gone) kills it and what it started, with no report", async () => {
  const ran = await runScript(["/bin/sh", "-c", "sleep 300 & echo started; sleep 300; echo never"], { PATH: "/usr/bin:/bin" }, "n", {
    cutAfterMs: 300,
  });
  expect(ran.stdout).toBe("started\n");
  expect(ran.stderr).not.toContain("\u001en");
});

test("a script cut short before its end line runs nothing", async () => {
  const script = jobScript(["/bin/sh", "-c", "echo ran"], {}, "n");
  const ran = await runScript([], {}, "n", { input: script.slice(0, script.length - 3), cutAfterMs: 100 });
  expect(ran).toMatchObject({ stdout: "", stderr: "" });
});

test("a name that is not a shell name is refused, not run", () => {
  expect(() => jobScript(["true"], { "BAD;rm": "x" }, "n")).toThrow(/not a shell name/);
});

test("the report is found across chunk boundaries; the agent's output before it passes whole", () => {
  const nonce = "boxcar-exit-abc";
  const stream = `line one\nlast without newline\u001e${nonce} 137\n`;
  for (let cut = 1; cut < stream.length; cut++) {
    const scanner = new ReportScanner(nonce);
    const out = Buffer.concat([scanner.take(Buffer.from(stream.slice(0, cut))), scanner.take(Buffer.from(stream.slice(cut)))]);
    expect(out.toString()).toBe("line one\nlast without newline");
    expect(scanner.report).toEqual({ exitCode: 137 });
  }
});

test("nothing is held back from output that does not end in the report's first character", () => {
  const scanner = new ReportScanner("boxcar-exit-abc");
  expect(scanner.take(Buffer.from("a whole line\n")).toString()).toBe("a whole line\n");
});

test("what comes after a report is dropped, not kept: an agent that forged one cannot fill the worker's memory", () => {
  const scanner = new ReportScanner("n");
  scanner.take(Buffer.from("\u001en 0"));
  for (let i = 0; i < 1000; i++) expect(scanner.take(Buffer.alloc(64 * 1024, 0x78)).length).toBe(0);
  expect(scanner.report).toEqual({ exitCode: 255 }); // cut at 16 bytes: "0xxxx…" is no exit code
});

test("output that only looks like the start of a report is passed on when the stream ends without one", () => {
  const scanner = new ReportScanner("boxcar-exit-abc");
  const passed = scanner.take(Buffer.from("text\n\u001eboxcar-exit-ab"));
  expect(passed.toString()).toBe("text\n");
  expect(scanner.rest().toString()).toBe("\u001eboxcar-exit-ab");
  expect(scanner.report).toBeUndefined();
});
