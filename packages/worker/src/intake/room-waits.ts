/**
 * How many of a worker's attempts wait for room in JetStream's store (run/room-wait.ts). While
 * any does, the pull loops take no new job: one would need room too (its claim, its record, its
 * output), and the room that frees goes first to the attempts that have run their agents already.
 */
export class RoomWaits {
  private waiting = 0;
  private readonly listeners = new Set<() => void>();
  private cleared: (() => void)[] = [];

  /** True while an attempt waits for room. */
  get any(): boolean {
    return this.waiting > 0;
  }

  /** An attempt starts waiting; the function returned says it stopped (calling it twice counts once). */
  begin(): () => void {
    this.waiting += 1;
    if (this.waiting === 1) for (const listener of [...this.listeners]) listener();
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.waiting -= 1;
      if (this.waiting > 0) return;
      const cleared = this.cleared;
      this.cleared = [];
      for (const resolve of cleared) resolve();
    };
  }

  /** Resolves once no attempt waits for room (at once when none does), or when `signal` aborts. */
  async none(signal: AbortSignal): Promise<void> {
    if (this.waiting === 0 || signal.aborted) return;
    await new Promise<void>((resolve) => {
      const done = () => {
        signal.removeEventListener("abort", done);
        resolve();
      };
      this.cleared.push(done);
      signal.addEventListener("abort", done, { once: true });
    });
  }

  /** Calls `started` each time an attempt starts waiting while none did; returns how to stop. */
  onWaiting(started: () => void): () => void {
    this.listeners.add(started);
    return () => this.listeners.delete(started);
  }
}
