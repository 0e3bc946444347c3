/**
 * A command in a session, as it runs: the environment it gets (`commandEnv`, as a job's less
 * what only a job has), and its output as it comes (`CommandOutput`): redacted of the session's
 * secrets, published live up to `MAX_LIVE_OUTPUT`, and the end of each stream kept for the
 * exec's reply (`OutputTail`). The session host runs commands with these.
 */

import type { Topology } from "@boxcar/fabric";
import { MAX_EXEC_REPLY_OUTPUT } from "@boxcar/protocol/internal";
import { headers as natsHeaders } from "@nats-io/transport-node";
import type { ExecOptions } from "../sandbox/sandbox.js";
import { AgentPaths } from "../workspace/agent-contract.js";
import { StreamRedactor } from "../workspace/redactor.js";
import type { HeldSession } from "./held-session.js";
import { type KeptSizes, WholeOutput } from "./whole-output.js";

/**
 * A command's output, published live on the session's log subject with its id in the
 * `Boxcar-Exec` header (a follower tells commands apart by it).
 */
export function liveOutput(held: HeldSession, execId: string, topology: Pick<Topology, "nc" | "names" | "artifacts">): CommandOutput {
  const hdrs = natsHeaders();
  hdrs.set("Boxcar-Exec", execId);
  const subject = (stream: "stdout" | "stderr") => topology.names.subjects.log(held.record.owner, held.record.id, stream);
  const whole = new WholeOutput(topology.artifacts, held.record.id, execId);
  return new CommandOutput(held.secrets, (stream, part) => topology.nc.publish(subject(stream), part, { headers: hdrs }), whole);
}

/** How a command of the session runs: its environment, output, folder and stdin. */
export function commandOptions(
  held: HeldSession,
  request: { id: string; env: Readonly<Record<string, string>>; stdin?: string | undefined },
  output: CommandOutput,
  cwd: string | undefined,
  signal: AbortSignal,
  /** Added by the worker, after the request's own (a background process's input key for the helper). */
  extraEnv: Readonly<Record<string, string>> = {},
): ExecOptions {
  return {
    env: { ...commandEnv(held, request), ...extraEnv },
    signal,
    onOutput: (stream, chunk) => output.push(stream, chunk),
    ...(cwd !== undefined ? { cwd } : {}),
    ...(request.stdin !== undefined ? { stdin: Buffer.from(request.stdin, "base64") } : {}),
  };
}

/** The most of a command's output published live (as a job's); the reply carries the end of it all. */
export const MAX_LIVE_OUTPUT = 4 * 1024 * 1024;

/** A command's environment: as a job's, less what only a job has (input, result, chain files). */
export function commandEnv(held: HeldSession, request: { id: string; env: Readonly<Record<string, string>> }): Record<string, string> {
  return {
    PATH: held.sandbox.agentPath ?? process.env.PATH ?? "/usr/bin:/bin",
    HOME: held.sandbox.workspace,
    LANG: "C.UTF-8",
    TMPDIR: `${held.sandbox.workspace}/${AgentPaths.tmp}`,
    ...held.env,
    ...withoutHelperNames(request.env),
    ...Object.fromEntries(held.secrets),
    BOXCAR_SESSION: request.id,
    BOXCAR_AGENT: held.record.agent,
    BOXCAR_WORKSPACE: held.sandbox.workspace,
  };
}

/** A request's environment without the names the session's helper takes for its own (`BOXCAR_HELPER_*`): only the worker sets those. */
function withoutHelperNames(env: Readonly<Record<string, string>>): Record<string, string> {
  return Object.fromEntries(Object.entries(env).filter(([name]) => !name.startsWith("BOXCAR_HELPER")));
}

/**
 * A command's output: each chunk redacted of the session's secrets, kept for the reply (its
 * end, `tails`), and published live with `publish` up to `MAX_LIVE_OUTPUT`.
 */
export class CommandOutput {
  readonly tails = { stdout: new OutputTail(), stderr: new OutputTail() };
  private readonly redactors: { stdout: StreamRedactor; stderr: StreamRedactor };
  // The live copy stops at MAX_LIVE_OUTPUT a command, as a job's output does, so that one
  // command cannot push everyone's output out of the size-capped logs stream.
  private published = 0;

  constructor(
    secrets: ReadonlyMap<string, string>,
    private readonly publish: (stream: "stdout" | "stderr", part: Uint8Array) => void,
    /** Keeps the whole output once it passes the live window; absent: nothing past it is kept. */
    private readonly whole?: WholeOutput,
  ) {
    this.redactors = { stdout: new StreamRedactor([...secrets.values()]), stderr: new StreamRedactor([...secrets.values()]) };
  }

  /** A chunk of the command's output, as the sandbox gives it. */
  push(stream: "stdout" | "stderr", chunk: Uint8Array): void {
    this.emit(stream, this.redactors[stream].push(chunk));
  }

  /**
   * The command has ended: what a redactor held back, in case it was the start of a secret; then
   * what was kept whole, if it wrote past the live window.
   */
  async end(): Promise<KeptSizes | undefined> {
    for (const stream of ["stdout", "stderr"] as const) this.emit(stream, this.redactors[stream].end());
    return this.whole?.end();
  }

  private emit(stream: "stdout" | "stderr", clean: Uint8Array): void {
    if (clean.length === 0) return;
    this.tails[stream].push(clean);
    this.whole?.push(stream, clean);
    if (this.published + clean.length > MAX_LIVE_OUTPUT) this.whole?.keep();
    if (this.published >= MAX_LIVE_OUTPUT) return;
    const part = clean.subarray(0, MAX_LIVE_OUTPUT - this.published);
    this.published += part.length;
    this.publish(stream, part);
  }
}

/** The last `MAX_EXEC_REPLY_OUTPUT` bytes of a stream, for an exec's reply. */
export class OutputTail {
  private chunks: Uint8Array[] = [];
  private size = 0;
  truncated = false;

  push(chunk: Uint8Array): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.size - (this.chunks[0]?.length ?? 0) >= MAX_EXEC_REPLY_OUTPUT) {
      this.size -= (this.chunks.shift() as Uint8Array).length;
      this.truncated = true;
    }
  }

  base64(): string {
    const all = Buffer.concat(this.chunks);
    if (all.length > MAX_EXEC_REPLY_OUTPUT) this.truncated = true;
    return all.subarray(Math.max(0, all.length - MAX_EXEC_REPLY_OUTPUT)).toString("base64");
  }
}
