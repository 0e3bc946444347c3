/**
 * The session helper's own verbs (helper/session-helper.cjs: `boxcar-helper hash | watch |
 * input`). A Docker session's resident helper is asked them as it is asked commands (an `exec`
 * whose argv[0] is `boxcar-helper`, answered by output and an exit, stopped by `kill`), so they
 * run inside the container, as its file operations do. A host session runs the helper alone for
 * a watch, with the worker's own Node.js, in its workspace; the rest a host session does here.
 */

import { readFileSync } from "node:fs";
import { StringDecoder } from "node:string_decoder";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { ExecResult, SessionSandbox } from "../sandbox/sandbox.js";

/** The helper's source, run alone by a host session's watch (a Docker session's container runs it already). */
const HELPER_SOURCE = readFileSync(new URL("../../helper/session-helper.cjs", import.meta.url), "utf8");

/** The most of a verb's output kept for its answer: its lines are short (a hash, a refusal). */
const MAX_ANSWER = 64 * 1024;
/** The longest line a running verb (a watch) may say: a path of 4 096 bytes in JSON, and room. */
const MAX_LINE = 16 * 1024;

/** What a verb said and how it ended: 0 done, 1 refused, 2 no such file or folder (`stderr` says why). */
export interface VerbAnswer {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Asks a Docker session's helper `args` (`["hash", path]`, say) and waits up to `timeoutMs` for
 * its answer. Its output is the session's own word, bounded here.
 */
export async function askHelper(
  sandbox: SessionSandbox,
  args: string[],
  opts: { stdin?: Uint8Array; timeoutMs: number },
): Promise<VerbAnswer> {
  const output = { stdout: "", stderr: "" };
  const stop = new AbortController();
  const timer = setTimeout(() => stop.abort(), opts.timeoutMs);
  let result: ExecResult;
  try {
    result = await sandbox.exec(["boxcar-helper", ...args], {
      env: {},
      signal: stop.signal,
      onOutput: (stream, chunk) => {
        if (output[stream].length < MAX_ANSWER) output[stream] += Buffer.from(chunk).toString("utf8");
      },
      ...(opts.stdin ? { stdin: opts.stdin } : {}),
    });
  } finally {
    clearTimeout(timer);
  }
  if (stop.signal.aborted) {
    throw new BoxcarError(ErrorCode.unavailable, `the session's helper did not finish ${args[0]} within ${opts.timeoutMs / 1000} s`);
  }
  return { code: result.exitCode, stdout: output.stdout, stderr: output.stderr.trim().slice(0, 500) };
}

/**
 * Runs a verb that goes on (a watch) until `signal` aborts: each line it says to `onLine`, what it
 * says on stderr (why it stopped) to `onComplaint`. Resolves when it has ended. Docker: in the
 * session's helper; host: the helper run alone by the worker's Node.js, in the workspace.
 */
export function runHelperVerb(
  sandbox: SessionSandbox,
  args: string[],
  opts: { signal: AbortSignal; onLine(line: string): void; onComplaint(text: string): void },
): Promise<ExecResult> {
  const lines = new LineSplitter(opts.onLine);
  let complaint = "";
  const onOutput = (stream: "stdout" | "stderr", chunk: Uint8Array) => {
    if (stream === "stdout") lines.push(chunk);
    else if (complaint.length < MAX_ANSWER) {
      complaint += Buffer.from(chunk).toString("utf8");
      opts.onComplaint(complaint.trim().slice(0, 500));
    }
  };
  const { kind } = sandbox;
  if (kind === "docker") return sandbox.exec(["boxcar-helper", ...args], { env: {}, signal: opts.signal, onOutput });
  if (kind === "host") {
    return sandbox.exec([process.execPath, "-e", "eval(process.env.BOXCAR_HELPER)", ...args], {
      env: { BOXCAR_HELPER: HELPER_SOURCE, PATH: process.env.PATH ?? "/usr/bin:/bin", LANG: "C.UTF-8" },
      signal: opts.signal,
      onOutput,
    });
  }
  throw notBuilt(kind, args[0] ?? "this");
}

/** What a session of `kind` cannot do yet (E2B's: its sandbox has no helper of ours). */
export function notBuilt(kind: string, what: string): BoxcarError {
  return new BoxcarError(
    ErrorCode.invalid,
    `${what} is built for Docker and host sessions, not yet for ${kind} ones: their files go through files.read and files.write (512 KiB at a time)`,
  );
}

/** Splits a stream of output into lines; a line past `MAX_LINE` is dropped (the helper is broken, or tampered with). */
class LineSplitter {
  private held = "";
  private dropping = false;
  /** A character split between two chunks is joined again. */
  private readonly decoder = new StringDecoder("utf8");

  constructor(private readonly onLine: (line: string) => void) {}

  push(chunk: Uint8Array): void {
    this.held += this.decoder.write(Buffer.from(chunk));
    for (let newline = this.held.indexOf("\n"); newline >= 0; newline = this.held.indexOf("\n")) {
      const line = this.held.slice(0, newline);
      this.held = this.held.slice(newline + 1);
      if (!this.dropping) this.onLine(line);
      this.dropping = false;
    }
    if (this.held.length > MAX_LINE) {
      this.held = "";
      this.dropping = true;
    }
  }
}
