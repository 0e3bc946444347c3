import { nowIso } from "@boxcar/fabric/internal";
import { BoxcarError, ErrorCode, type JobRecord, MAX_SIGNALS, signalFile, TOKEN_PATTERN } from "@boxcar/protocol";
import type { Msg } from "@nats-io/transport-node";
import type { JobSignal, JobSignals } from "../harness/prompt-loop.js";
import type { Sandbox } from "../sandbox/sandbox.js";
import type { Redactor } from "../workspace/redactor.js";
import type { StopReason } from "./attempt-outcome.js";
import type { JobEvents } from "./job-events.js";

/**
 * The signals an attempt's job has had (those kept in its record, then those sent while it runs),
 * in the order they came, for a prompt agent's loop to wait on (an approval). A command agent
 * reads them as files instead.
 */
export class SignalBox implements JobSignals {
  private readonly seen: JobSignal[] = [];
  private readonly waiters = new Set<() => void>();

  add(signal: JobSignal): void {
    this.seen.push(signal);
    for (const wake of [...this.waiters]) wake();
  }

  count(): number {
    return this.seen.length;
  }

  wait(match: (signal: JobSignal, index: number) => boolean, abort: AbortSignal): Promise<JobSignal> {
    return new Promise((resolve, reject) => {
      const check = () => {
        const index = this.seen.findIndex(match);
        if (index < 0) return;
        done();
        resolve(this.seen[index] as JobSignal);
      };
      const stopped = () => {
        done();
        reject(new BoxcarError(ErrorCode.cancelled, "the job ended while a tool call waited for approval"));
      };
      const done = () => {
        this.waiters.delete(check);
        abort.removeEventListener("abort", stopped);
      };
      if (abort.aborted) return stopped();
      this.waiters.add(check);
      abort.addEventListener("abort", stopped, { once: true });
      check();
    });
  }
}

/** How long a signal that comes before the job's sandbox is ready waits for it. */
const SIGNAL_WAIT_MS = 4_000;

/** What a job's signals need of its run. */
export interface AgentSignalsContext {
  redactor: Pick<Redactor, "json">;
  events: Pick<JobEvents, "job">;
  /** Why the run was stopped, once it was: a signal is refused from then on. */
  stopReason(): StopReason | undefined;
}

/**
 * The signals sent to one delivery's job (docs/flow-control.md#signals): written to its agent's
 * signals folder as `<n>-<name>.json` while the agent runs, numbered in the order they came
 * (those kept in its record first), and put in `box` for a prompt agent's loop. A signal that
 * comes once the job is claimed but before its sandbox is ready waits a little for it.
 */
export class AgentSignals {
  /** The signals so far, for a prompt agent's loop (an approval waits on one). */
  readonly box = new SignalBox();
  private count = 0;
  /** The sandbox from when it is ready until the agent ends: where signals are written. */
  private sandbox: Sandbox | undefined;
  private agentEnded = false;
  /** Told when the sandbox is ready: a signal that comes before waits for it. */
  private readonly sandboxReady = new Set<() => void>();

  constructor(private readonly ctx: AgentSignalsContext) {}

  /**
   * A signal to the job, from a dispatcher: written to the agent's signals folder
   * (`{ name, payload, at }`), then a `signal` event; the dispatcher is answered with the file, or
   * why there is none (the agent is not running).
   */
  async receive(msg: Msg): Promise<void> {
    const answer = (body: { file: string } | { error: string }) => msg.respond(JSON.stringify(this.ctx.redactor.json(body)));
    let signal: { name?: unknown; payload?: unknown };
    try {
      signal = msg.json();
    } catch {
      answer({ error: "not a signal" });
      return;
    }
    if (typeof signal.name !== "string" || !TOKEN_PATTERN.test(signal.name)) {
      answer({ error: "a signal's name is 1-64 letters, digits, '-' or '_'" });
      return;
    }
    if (this.count >= MAX_SIGNALS) {
      answer({ error: `it has had ${MAX_SIGNALS} signals, the most a job takes` });
      return;
    }
    // Claimed but its sandbox not yet ready: the signal waits for it a little (the dispatcher waits 5 s).
    if (!this.sandbox && !this.ctx.stopReason() && !this.agentEnded) {
      await new Promise<void>((resolve) => {
        const ready = () => {
          clearTimeout(timer);
          this.sandboxReady.delete(ready);
          resolve();
        };
        const timer = setTimeout(ready, SIGNAL_WAIT_MS);
        this.sandboxReady.add(ready);
      });
    }
    const sandbox = this.sandbox;
    if (!sandbox || this.ctx.stopReason()) {
      answer({ error: "its agent is not running (it is starting, or ending)" });
      return;
    }
    const file = signalFile(++this.count, signal.name);
    try {
      await sandbox.writeFile(file, Buffer.from(JSON.stringify({ name: signal.name, payload: signal.payload ?? null, at: nowIso() })));
    } catch (err) {
      answer({ error: `could not write the signal: ${(err as Error).message}` });
      return;
    }
    this.box.add({ name: signal.name, payload: signal.payload ?? null });
    void this.ctx.events.job("signal", "running", { message: `signal ${signal.name} in ${file}` });
    answer({ file });
  }

  /**
   * The agent's sandbox is ready: writes the signals sent to the job before this attempt began
   * (`kept`, from its record as it was claimed), in the order they came, so every attempt's agent
   * finds them; then the signals that wait for the sandbox go to it.
   */
  async open(sandbox: Sandbox, kept: NonNullable<JobRecord["signals"]>): Promise<void> {
    for (const signal of kept) {
      await sandbox.writeFile(signalFile(++this.count, signal.name), Buffer.from(JSON.stringify(signal)));
      this.box.add({ name: signal.name, payload: signal.payload });
    }
    this.sandbox = sandbox;
    for (const ready of this.sandboxReady) ready();
  }

  /** The agent ended: signals are refused from now on. */
  close(): void {
    this.sandbox = undefined;
    this.agentEnded = true;
  }

  /** The run was stopped: signals waiting for the sandbox are refused now. */
  refuseWaiting(): void {
    for (const waiting of this.sandboxReady) waiting();
  }
}
