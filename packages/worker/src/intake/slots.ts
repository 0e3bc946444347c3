/** Counts free job slots, shared by the pull loops of every pool. */
export class Slots {
  private free: number;
  private waiters: (() => void)[] = [];
  private readonly fullListeners = new Set<() => void>();
  private closed = false;

  constructor(capacity: number) {
    this.free = capacity;
  }

  /** Takes between 1 and `max` free slots, waiting for one if none is free; 0 once closed. */
  async acquire(max: number): Promise<number> {
    while (!this.closed && this.free === 0) await new Promise<void>((resolve) => this.waiters.push(resolve));
    if (this.closed) return 0;
    const taken = Math.min(max, this.free);
    this.take(taken);
    return taken;
  }

  /** Takes one free slot if there is one, at once; false when none is free or the slots are closed. */
  tryAcquire(): boolean {
    if (this.closed || this.free === 0) return false;
    this.take(1);
    return true;
  }

  /**
   * Takes one slot, waiting at most `ms` for one to free (a pool's sweep holds the slots it may
   * fill only while it asks for work); false when none freed in time or the slots are closed.
   */
  async acquireWithin(ms: number): Promise<boolean> {
    const until = Date.now() + ms;
    while (!this.tryAcquire()) {
      const left = until - Date.now();
      if (this.closed || left <= 0) return false;
      let timer: NodeJS.Timeout | undefined;
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        timer = setTimeout(resolve, left);
      });
      clearTimeout(timer);
    }
    return true;
  }

  /** Calls `full` each time the last free slot is taken; returns how to stop. */
  onFull(full: () => void): () => void {
    this.fullListeners.add(full);
    return () => this.fullListeners.delete(full);
  }

  release(count: number): void {
    if (count <= 0) return;
    this.free += count;
    this.wake();
  }

  /** Wakes every waiter with 0: no more work is taken. */
  close(): void {
    this.closed = true;
    this.wake();
  }

  private take(count: number): void {
    this.free -= count;
    if (count > 0 && this.free === 0) for (const full of [...this.fullListeners]) full();
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}
