/** Counts free job slots, shared by the pull loops of every pool. */
export class Slots {
  private free: number;
  private waiters: (() => void)[] = [];
  private closed = false;

  constructor(capacity: number) {
    this.free = capacity;
  }

  /** Takes between 1 and `max` free slots, waiting for one if none is free; 0 once closed. */
  async acquire(max: number): Promise<number> {
    while (!this.closed && this.free === 0) await new Promise<void>((resolve) => this.waiters.push(resolve));
    if (this.closed) return 0;
    const taken = Math.min(max, this.free);
    this.free -= taken;
    return taken;
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

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}
