/**
 * Work a dispatcher does every so often and on demand (a sweep): one pass at a time, a call made
 * while a pass runs getting that pass. A pass that fails is reported to `onError` when it ran on
 * the timer; a caller of `run` gets its rejection.
 */
export class Periodic<T> {
  private running: Promise<T> | undefined;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly pass: () => Promise<T>,
    intervalMs: number,
    onError: (err: unknown) => void,
  ) {
    this.timer = setInterval(() => void this.run().catch(onError), intervalMs);
  }

  /** Runs a pass now, or joins the one under way. */
  run(): Promise<T> {
    this.running ??= this.pass().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  /** Stops the timer and waits for the pass under way, if any (its failure is not this call's). */
  async close(): Promise<void> {
    clearInterval(this.timer);
    await this.running?.catch(() => {});
  }
}
