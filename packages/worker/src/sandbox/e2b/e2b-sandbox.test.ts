import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BoxcarError } from "@boxcar/protocol";
import { AuthenticationError, RateLimitError, SandboxError, ServiceBusyError, TimeoutError } from "e2b";
import { afterAll, describe, expect, test } from "vitest";
import { agentCommand, environmentFile } from "./e2b-command.js";
import { e2bError } from "./e2b-errors.js";
import { signalOf } from "./e2b-job-sandbox.js";
import { resolveE2BSandboxOptions } from "./e2b-options.js";
import { createE2BSandboxProvider } from "./e2b-sandbox.js";

describe("agentCommand and environmentFile", () => {
  const folders: string[] = [];
  afterAll(() => {
    for (const folder of folders) rmSync(folder, { recursive: true, force: true });
  });

  /** Runs the line the way the SDK does (`bash -c`), after a "profile" that changes the environment. */
  function runLine(argv: string[], env: Record<string, string>) {
    const folder = mkdtempSync(join(tmpdir(), "boxcar-e2b-unit-"));
    folders.push(folder);
    const envFile = join(folder, "env");
    writeFileSync(envFile, environmentFile(env));
    const line = agentCommand(argv, envFile);
    const profile = "export PATH=/usr/bin:/bin PROFILE_JUNK=1 GREETING=clobbered; ";
    const result = spawnSync("/bin/bash", ["-c", profile + line], { env: { CARRIED: "by the shell" }, encoding: "utf8" });
    return { line, envFile, result };
  }

  test("runs argv word for word with exactly the given environment, whatever the profile set, and removes the file first", () => {
    const env = { PATH: "/usr/bin:/bin", HOME: "/w", GREETING: 'it\'s "$HOME" `id`\nline two', EMPTY: "" };
    const { envFile, result } = runLine(["env"], env);
    expect(result.status).toBe(0);
    expect(result.stdout).toBe(`PATH=/usr/bin:/bin\nHOME=/w\nGREETING=${env.GREETING}\nEMPTY=\n`);
    expect(existsSync(envFile)).toBe(false);

    const argv = ["printf", "[%s]\\n", "a b", "it's", "$HOME", "`id`", "x\ny", "", "*"];
    const printed = runLine(argv, { PATH: "/usr/bin:/bin" }).result;
    expect(printed.stdout).toBe("[a b]\n[it's]\n[$HOME]\n[`id`]\n[x\ny]\n[]\n[*]\n");
  });

  test("with a stdin file: the command reads it, and both files are gone before it starts", () => {
    const folder = mkdtempSync(join(tmpdir(), "boxcar-e2b-unit-"));
    folders.push(folder);
    const [envFile, stdinFile] = [join(folder, "env"), join(folder, "stdin")];
    writeFileSync(envFile, environmentFile({ PATH: "/usr/bin:/bin" }));
    writeFileSync(stdinFile, "piped in\n");
    const line = agentCommand(["sh", "-c", `tr a-z A-Z; ls ${folder} | wc -l`], envFile, stdinFile);
    const result = spawnSync("/bin/bash", ["-c", line], { encoding: "utf8" });
    expect(result.stdout).toBe("PIPED IN\n0\n");
  });

  test("when a file cannot be read the command does not run, and neither file is left (they hold the environment)", () => {
    const folder = mkdtempSync(join(tmpdir(), "boxcar-e2b-unit-"));
    folders.push(folder);
    const [envFile, marker] = [join(folder, "env"), join(folder, "ran")];
    writeFileSync(envFile, environmentFile({ PATH: "/usr/bin:/bin", TOKEN: "s3cr3t" }));
    const line = agentCommand(["touch", marker], envFile, join(folder, "missing-stdin"));
    const result = spawnSync("/bin/bash", ["-c", line], { encoding: "utf8" });
    expect(result.status).not.toBe(0);
    expect(existsSync(marker)).toBe(false);
    expect(existsSync(envFile)).toBe(false);
  });

  test("no value is in the command line: only the file's path", () => {
    const line = agentCommand(["true"], "/w/.boxcar/env-1");
    expect(line).toBe(
      `mapfile -d '' -t BOXCAR_ENV < '/w/.boxcar/env-1'; ok=$?; rm -f '/w/.boxcar/env-1'; [ $ok -eq 0 ] && exec setsid env -i "\${BOXCAR_ENV[@]}" 'true'`,
    );
    expect(new TextDecoder().decode(environmentFile({ TOKEN: "s3cr3t", B: "" }))).toBe("TOKEN=s3cr3t\0B=\0");
  });

  test("the agent leads its own process group", () => {
    const { result } = runLine(["bash", "-c", 'test "$(ps -o pgid= -p $$ | tr -d " ")" = "$$" && echo leader'], { PATH: "/usr/bin:/bin" });
    expect(result.stdout).toBe("leader\n");
  });

  test.each([
    ["no command", []],
    ["an empty command", [""]],
    ["a command env would read as an option", ["-x"]],
    ["a command env would read as a variable", ["A=B"]],
    ["a NUL byte", ["echo", "a\0b"]],
  ])("refuses %s", (_what, argv) => {
    expect(() => agentCommand(argv, "/f")).toThrow(expect.objectContaining({ code: "invalid" }));
  });

  test.each([
    ["a name that is not one", { "BAD-NAME": "x" }],
    ["a NUL byte in a value", { A: "x\0y" }],
  ])("refuses an environment with %s", (_what, env) => {
    expect(() => environmentFile(env)).toThrow(expect.objectContaining({ code: "invalid" }));
  });
});

describe("signalOf", () => {
  test.each([
    ["signal: killed", "SIGKILL"],
    ["signal: terminated", "SIGTERM"],
    ["signal: segmentation fault", "SIGSEGV"],
    ["signal: something new", "something new"],
    ["exit status 3", null],
    [undefined, null],
  ])("%s -> %s", (status, signal) => {
    expect(signalOf(status)).toBe(signal);
  });
});

describe("e2bError", () => {
  const withStatus = (status: number, message: string) => Object.assign(new SandboxError(`${status}: ${message}`), { statusCode: status });
  const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:9"), { code: "ECONNREFUSED" });

  test.each([
    ["a refused API key", new AuthenticationError("Unauthorized"), "sandbox_failed", "E2B refused the worker's API key (401)"],
    ["the rate limit or quota", new RateLimitError("Rate limit exceeded"), "sandbox_failed", "(429)"],
    ["a busy E2B", new ServiceBusyError("Service temporarily unavailable"), "unavailable", "(503)"],
    ["a missing template", withStatus(404, "template 'x' not found"), "image_unavailable", "no template tpl (404)"],
    ["a refused request", withStatus(400, "Timeout cannot be greater than 24 hours"), "invalid", "24 hours"],
    ["an unreachable E2B", new TypeError("fetch failed", { cause: refused }), "unavailable", "ECONNREFUSED"],
    ["a sandbox that is gone", new TimeoutError("sandbox not found"), "sandbox_failed", "the sandbox is gone"],
    ["anything else", new Error("surprise"), "sandbox_failed", "surprise"],
  ])("%s", (_what, err, code, mentions) => {
    const mapped = e2bError(err, "creating", { template: "tpl" });
    expect(mapped).toBeInstanceOf(BoxcarError);
    expect(mapped.code).toBe(code);
    expect(mapped.message).toContain("creating: ");
    expect(mapped.message).toContain(mentions);
    expect(mapped.cause).toBe(err);
  });

  test("a 404 that is not about a template is not image_unavailable", () => {
    expect(e2bError(withStatus(404, "gone"), "reading").code).toBe("sandbox_failed");
  });
});

describe("options", () => {
  test("defaults", () => {
    expect(resolveE2BSandboxOptions({})).toEqual({
      apiKey: undefined,
      domain: undefined,
      apiUrl: undefined,
      sandboxUrl: undefined,
      defaultTemplate: "base",
      timeoutMarginMs: 300_000,
      workspace: "workspace",
      prefix: undefined,
      agentPath: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      killGraceMs: 10_000,
    });
  });

  test.each([
    ["a negative margin", { timeoutMarginMs: -1 }, "timeoutMarginMs"],
    ["a workspace with '..'", { workspace: "../elsewhere" }, "workspace"],
    ["the root as workspace", { workspace: "/" }, "workspace"],
    ["an API URL that is not one", { apiUrl: "not a url" }, "apiUrl"],
  ])("refuses %s", (_what, opts, mentions) => {
    expect(() => resolveE2BSandboxOptions(opts)).toThrow(
      expect.objectContaining({ code: "invalid", message: expect.stringContaining(mentions) }),
    );
  });

  test("without an API key the backend is not offered and creates nothing, without asking E2B", async () => {
    const provider = createE2BSandboxProvider({ apiUrl: "http://127.0.0.1:9" });
    expect(provider.kind).toBe("e2b");
    expect(await provider.available()).toBe(false);
    expect(provider.reap).toBeUndefined();
    const spec = {
      id: "s",
      jobId: "j",
      attempt: 1,
      workerId: "w",
      runtime: { sandbox: "e2b" as const, network: "none", timeout: 1000, limits: {} },
    };
    await expect(provider.create(spec)).rejects.toMatchObject({ code: "sandbox_failed", message: expect.stringContaining("E2B_API_KEY") });
  });

  test("reap is offered only with a prefix naming this system", () => {
    expect(createE2BSandboxProvider({ apiKey: "k" }).reap).toBeUndefined();
    expect(createE2BSandboxProvider({ apiKey: "k", prefix: "p" }).reap).toBeTypeOf("function");
  });
});
