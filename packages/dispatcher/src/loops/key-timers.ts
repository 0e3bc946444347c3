/** The longest a timer is set for (setTimeout's own limit is about 24.8 days): a later time is reached a day at a time. */
export const MAX_TIMER_MS = 86_400_000;

/**
 * One-shot timers by key (a run's deadline, a schedule's next tick, a retry): setting a key's
 * timer replaces the one it had, and `stop` clears them all and sets no more.
 */
export class KeyTimers {
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private stopped = false;

  constructor(private readonly opts: { unref?: boolean } = {}) {}

  /** Calls `fire` in `inMs` (at once when not positive; a time past `MAX_TIMER_MS` in steps), in place of the key's timer. */
  set(key: string, inMs: number, fire: () => void): void {
    if (this.stopped) return;
    this.clear(key);
    const timer = setTimeout(
      () => {
        this.timers.delete(key);
        if (inMs > MAX_TIMER_MS) this.set(key, inMs - MAX_TIMER_MS, fire);
        else fire();
      },
      Math.min(Math.max(0, inMs), MAX_TIMER_MS),
    );
    if (this.opts.unref) timer.unref();
    this.timers.set(key, timer);
  }

  /** Whether the key has a timer set. */
  has(key: string): boolean {
    return this.timers.has(key);
  }

  /** Clears the key's timer, if any. */
  clear(key: string): void {
    clearTimeout(this.timers.get(key));
    this.timers.delete(key);
  }

  /** Clears every timer; none is set after this. */
  stop(): void {
    this.stopped = true;
    for (const timer of this.timers.values()) clearTimeout(timer);
    this.timers.clear();
  }
}
