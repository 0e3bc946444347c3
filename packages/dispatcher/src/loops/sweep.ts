/** How a sweep is made: its pass, how often it runs on its own, and who hears of a pass that failed. */
export interface SweepOptions<T> {
  /** One pass. `signal` is aborted once the sweep stops: a long pass ends between its steps. */
  pass: (signal: AbortSignal) => Promise<T>;
  /** From one pass on the timer to the next. */
  intervalMs: number;
  /** Told of a pass on the timer that failed (a caller of `run` gets its rejection instead). */
  onError: (err: unknown) => void;
  /** Lets the process end while this sweep's timer is all that is left. */
  unref?: boolean;
}

/**
 * The one shape of the dispatcher's background work: a pass made every `intervalMs` once
 * started, and on demand. One pass at a time: `run` while a pass is under way gets that pass,
 * and a tick of the timer then makes none. `stop` clears the timer, aborts the pass's signal
 * and waits for the pass under way; it is safe to call twice. Every sweep (retention, expiry,
 * given-up work, ...) and the per-job timers (`JobTimers`) are one.
 */
export class Sweep<T = void> {
  readonly intervalMs: number;
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<T> | undefined;
  private readonly stopping = new AbortController();

  constructor(private readonly opts: SweepOptions<T>) {
    this.intervalMs = opts.intervalMs;
  }

  /** Sets the timer (once; not after `stop`). */
  start(): void {
    if (this.timer !== undefined || this.stopped) return;
    this.timer = setInterval(() => void this.run().catch(this.opts.onError), this.intervalMs);
    if (this.opts.unref) this.timer.unref();
  }

  /** Makes a pass now, or joins the one under way. */
  run(): Promise<T> {
    this.running ??= this.opts.pass(this.stopping.signal).finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  /** True once `stop` was called. */
  get stopped(): boolean {
    return this.stopping.signal.aborted;
  }

  /** Clears the timer and waits for the pass under way, if any (its failure is not this call's). */
  async stop(): Promise<void> {
    this.stopping.abort();
    clearInterval(this.timer);
    await this.running?.catch(() => {});
  }
}
