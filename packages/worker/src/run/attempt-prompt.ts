import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import type { ErrorInfo, HarnessStep, PromptAgent } from "@boxcar/protocol";
import { Checkpoints } from "../harness/checkpoint.js";
import { type JobSignals, type LoopEventType, runPromptLoop } from "../harness/prompt-loop.js";
import type { AttemptLease } from "../sandbox/lifeline.js";
import type { ExecResult, Sandbox } from "../sandbox/sandbox.js";
import { AgentPaths } from "../workspace/agent-contract.js";

/** What a prompt agent's attempt needs of its run. */
export interface PromptAttemptContext {
  agent: PromptAgent;
  handoffs: readonly string[];
  signals: JobSignals;
  input: unknown;
  jobId: string;
  attempt: number;
  topology: Pick<Topology, "artifacts">;
  env: Record<string, string>;
  modelEnv: Record<string, string>;
  signal: AbortSignal;
  attemptLease?: AttemptLease | undefined;
  event(type: LoopEventType, step: HarnessStep, message: string): void;
  onText(text: string): void;
  progress(message: string): void;
  log: Logger;
}

/**
 * Runs a prompt agent's loop in place of a command (docs/harness.md) and leaves its result in
 * the workspace as a command agent does (`.boxcar/result.json`: the model's last answer as
 * `output.text`, or the guard that ended it, not to be retried), so the attempt ends as any
 * other: its artifacts, its result. Returns the run as an exec's result, and the guard's error.
 */
export async function runPromptAttempt(sandbox: Sandbox, ctx: PromptAttemptContext): Promise<{ exec: ExecResult; guard?: ErrorInfo }> {
  const started = performance.now();
  const ran = (exitCode: number | null, aborted = false): ExecResult => ({
    exitCode,
    signal: null,
    aborted,
    durationMs: Math.round(performance.now() - started),
  });
  try {
    const end = await runPromptLoop({ ...ctx, sandbox, checkpoints: new Checkpoints(ctx.topology, ctx.jobId) });
    const result = end.error
      ? { error: end.error.message, retry: false, output: { steps: end.steps, tokens: end.tokens } }
      : {
          output: { text: end.text ?? "", steps: end.steps, tokens: end.tokens },
          summary: summaryOf(end.text ?? ""),
          ...(end.handoff ? { handoff: end.handoff } : {}),
        };
    await sandbox.writeFile(AgentPaths.result, new TextEncoder().encode(JSON.stringify(result)));
    return { exec: ran(end.error ? 1 : 0), ...(end.error ? { guard: end.error } : {}) };
  } catch (err) {
    if (ctx.signal.aborted) return { exec: ran(null, true) };
    throw err;
  }
}

/** The answer's first line, for people. */
function summaryOf(text: string): string {
  const line = text.trim().split("\n")[0] ?? "";
  return line.length > 200 ? `${line.slice(0, 200)}...` : line;
}
