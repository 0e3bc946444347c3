import { BoxcarError, ErrorCode, type ExecReply, type ProcessInfo, type WaitReply } from "@boxcar/protocol";
import { MAX_BACKGROUND_PROCESSES, MAX_ENDED_PROCESSES } from "@boxcar/protocol/internal";
import type { ExecResult } from "../sandbox/sandbox.js";
import type { ProcessStdin } from "./process-input.js";

/**
 * A session's background processes (docs/sessions.md#background-processes): commands started
 * with `sessions.start`, which return at once and run beside the session's commands and jobs
 * (at most `MAX_BACKGROUND_PROCESSES` at a time), each bounded by its timeout and the session's
 * limits, killed when the session closes. Their output goes live on the session's log subject as
 * an exec's does; the end of it is kept for `sessions.wait`. The last `MAX_ENDED_PROCESSES`
 * that ended are remembered.
 */
export class BackgroundProcesses {
  private readonly byId = new Map<string, Background>();
  /** The session is paused: the processes' timeouts wait (docs/sessions.md#pause). */
  private paused = false;

  get running(): number {
    return [...this.byId.values()].filter((p) => p.info.running).length;
  }

  /** Throws `conflict` when as many run as may. */
  checkRoom(): void {
    if (this.running >= MAX_BACKGROUND_PROCESSES) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `the session runs ${MAX_BACKGROUND_PROCESSES} processes in the background already, the most it may: wait for one or kill it`,
      );
    }
  }

  /** Starts `run` in the background; `ended` is told once it ended (its reply). */
  start(execId: string, argv: readonly string[], { run, output, timeoutMs, ended, stdin, terminal }: StartParts): ProcessInfo {
    this.checkRoom();
    const stop = new AbortController();
    const started = Date.now();
    const process: Background = {
      info: {
        execId,
        argv: [...argv],
        startedAt: new Date(started).toISOString(),
        running: true,
        ...(stdin ? { stdin: "open" } : {}),
        ...(terminal ? { terminal: true } : {}),
      },
      stop,
      killed: false,
      timedOut: false,
      done: undefined as unknown as Promise<ExecReply>,
      ...(stdin ? { stdin, input: Promise.resolve() } : {}),
    };
    const timer = new Countdown(() => {
      process.timedOut = true;
      stop.abort();
    }, timeoutMs);
    process.timer = timer;
    if (this.paused) timer.hold();
    process.done = run(stop.signal)
      .then(async (result): Promise<ExecReply> => {
        const kept = await output.end();
        return {
          execId,
          exitCode: result.exitCode,
          signal: result.signal,
          timedOut: process.timedOut,
          cancelled: process.killed,
          durationMs: result.durationMs,
          stdout: output.tails.stdout.base64(),
          stderr: output.tails.stderr.base64(),
          truncated: output.tails.stdout.truncated || output.tails.stderr.truncated,
          ...(kept ? { kept } : {}),
        };
      })
      .catch(async (err: unknown): Promise<ExecReply> => {
        await output.end().catch(() => undefined);
        const why = new TextEncoder().encode(`boxcar: it did not run: ${(err as Error).message}\n`);
        return {
          execId,
          exitCode: null,
          signal: null,
          timedOut: false,
          cancelled: process.killed,
          durationMs: Date.now() - started,
          stdout: "",
          stderr: Buffer.from(why).toString("base64"),
          truncated: false,
        };
      })
      .then((reply) => {
        timer.clear();
        process.stdin?.dispose();
        process.info = {
          ...process.info,
          ...(process.stdin ? { stdin: "closed" as const } : {}),
          running: false,
          exitCode: reply.exitCode,
          signal: reply.signal,
          timedOut: reply.timedOut,
          killed: process.killed,
          durationMs: reply.durationMs,
        };
        this.forgetOldest();
        ended(reply);
        return reply;
      });
    this.byId.set(execId, process);
    return process.info;
  }

  /** The session is paused: each running process's timeout stops counting, what is left of it kept. */
  pause(): void {
    this.paused = true;
    for (const process of this.byId.values()) process.timer?.hold();
  }

  /** The session runs again: each timeout counts on from what was left of it. */
  resume(): void {
    this.paused = false;
    for (const process of this.byId.values()) process.timer?.go();
  }

  list(): ProcessInfo[] {
    return [...this.byId.values()].map((p) => p.info);
  }

  /** Waits up to `timeoutMs` for it to end: its state, and its result once it ended. */
  async wait(execId: string, timeoutMs: number): Promise<WaitReply> {
    const process = this.get(execId);
    let timer: NodeJS.Timeout | undefined;
    const result = await Promise.race([
      process.done,
      new Promise<undefined>((resolve) => {
        timer = setTimeout(() => resolve(undefined), timeoutMs);
      }),
    ]);
    clearTimeout(timer);
    return { process: process.info, ...(result ? { result } : {}) };
  }

  /**
   * Writes `data` to its stdin (one input after another, in the order asked), then closes it if
   * `close`. Refused, saying why, for a process started without `openStdin`, one that ended, and
   * one whose stdin was closed.
   */
  async input(execId: string, data: Uint8Array, close: boolean): Promise<{ process: ProcessInfo; written: number }> {
    const process = this.get(execId);
    const { stdin } = process;
    if (!stdin) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `${execId} was not started with openStdin: its stdin ended after what its start gave it (start it with --open-stdin)`,
      );
    }
    if (!process.info.running) throw new BoxcarError(ErrorCode.conflict, `${execId} has ended: it takes no more input`);
    if (process.info.stdin === "closed") throw new BoxcarError(ErrorCode.conflict, `${execId}'s stdin was closed: it takes no more input`);
    // Closed from now: an input asked after this one is refused, not written after the end.
    if (close) process.info = { ...process.info, stdin: "closed" };
    const written = (process.input ?? Promise.resolve()).then(async () => {
      if (data.length > 0) await stdin.write(data);
      if (close) await stdin.end();
    });
    process.input = written.catch(() => {});
    await written;
    return { process: process.info, written: data.length };
  }

  /** Kills it (its process group, as a timeout does); one that ended already is left as it is. */
  kill(execId: string): ProcessInfo {
    const process = this.get(execId);
    if (process.info.running) {
      process.killed = true;
      process.stop.abort();
    }
    return process.info;
  }

  /** Kills every one still running (the session closes) and waits for them to end. */
  async stopAll(): Promise<void> {
    const running = [...this.byId.values()].filter((p) => p.info.running);
    for (const process of running) {
      process.killed = true;
      process.stop.abort();
    }
    await Promise.all(running.map((p) => p.done));
  }

  private get(execId: string): Background {
    const process = this.byId.get(execId);
    if (!process) throw new BoxcarError(ErrorCode.notFound, `no background process ${execId} in this session (or it ended long ago)`);
    return process;
  }

  private forgetOldest(): void {
    const ended = [...this.byId.values()].filter((p) => !p.info.running);
    for (const old of ended.slice(0, Math.max(0, ended.length - MAX_ENDED_PROCESSES))) this.byId.delete(old.info.execId);
  }
}

/** A timeout that can be held (a paused session's): `hold` keeps what is left of it, `go` counts on from there. */
class Countdown {
  private timer: NodeJS.Timeout | undefined;
  private left: number;
  private since = 0;
  private cleared = false;

  constructor(
    private readonly fire: () => void,
    ms: number,
  ) {
    this.left = ms;
    this.go();
  }

  hold(): void {
    if (this.timer === undefined) return;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.left = Math.max(0, this.left - (Date.now() - this.since));
  }

  go(): void {
    if (this.cleared || this.timer !== undefined) return;
    this.since = Date.now();
    this.timer = setTimeout(() => {
      this.cleared = true;
      this.fire();
    }, this.left);
  }

  clear(): void {
    this.cleared = true;
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}

interface Background {
  info: ProcessInfo;
  stop: AbortController;
  /** Its timeout (held while the session is paused). */
  timer?: Countdown;
  killed: boolean;
  timedOut: boolean;
  done: Promise<ExecReply>;
  /** Its open stdin (started with `openStdin`), and the last input written to it. */
  stdin?: ProcessStdin;
  input?: Promise<void>;
}

/** What a process's output keeps for its end (a session command's `CommandOutput`). */
export interface KeptOutput {
  /** Ends it: what was kept whole, if anything. */
  end(): Promise<ExecReply["kept"]>;
  readonly tails: Record<"stdout" | "stderr", { base64(): string; readonly truncated: boolean }>;
}

export interface StartParts {
  run(signal: AbortSignal): Promise<ExecResult>;
  output: KeptOutput;
  timeoutMs: number;
  ended(reply: ExecReply): void;
  /** Its stdin, kept open for input (`openStdin`). */
  stdin?: ProcessStdin | undefined;
  /** It runs on a terminal (`sessions.shell`). */
  terminal?: boolean;
}
