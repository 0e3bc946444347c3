/**
 * Work done on one key at a time (a limit's places, a schedule, a workflow run): a call while
 * the key's pass runs makes one more pass after it, not a second at once. A pass that fails is
 * reported to `onError`.
 */
export class PassPerKey {
  private readonly passes = new Map<string, { again: boolean; done: Promise<void> }>();
  private stopped = false;

  constructor(
    private readonly pass: (key: string) => Promise<void>,
    private readonly onError: (err: unknown, key: string) => void,
  ) {}

  /** Runs a pass for `key` (or one more after the one under way); resolves once the key's passes are done. */
  run(key: string): Promise<void> {
    if (this.stopped) return Promise.resolve();
    const running = this.passes.get(key);
    if (running) {
      running.again = true;
      return running.done;
    }
    const entry = { again: false, done: Promise.resolve() };
    entry.done = (async () => {
      do {
        entry.again = false;
        await this.pass(key).catch((err: unknown) => this.onError(err, key));
      } while (entry.again && !this.stopped);
      this.passes.delete(key);
    })();
    this.passes.set(key, entry);
    return entry.done;
  }

  /** Starts no more passes, and waits for those under way. */
  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all([...this.passes.values()].map((entry) => entry.done));
  }
}
