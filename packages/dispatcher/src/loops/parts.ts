import type { Logger } from "@boxcar/common";
import { patiently } from "@boxcar/fabric";

/** One part of a role: a sweep, a consumer, a watch, a book kept by one, the API. */
export interface Part {
  /** What it is, as the role's logs name it ("the expiry sweep"). */
  readonly name: string;
  /** Starts it; absent when it has nothing to start. */
  start?(): Promise<void> | void;
  /** Stops it, and waits for what it has under way. */
  stop(): Promise<void> | void;
}

/**
 * A role's parts as one ordered list, the one place that says how the role starts and stops:
 * `start` starts them in the order listed, and `stop` stops those started in the reverse order,
 * so a part is started after, and stopped before, the parts it uses. The list is the shutdown
 * order.
 */
export class Parts {
  private readonly started: Part[] = [];
  private stopping: Promise<void> | undefined;

  constructor(
    readonly list: readonly Part[],
    private readonly log: Logger,
  ) {}

  /**
   * Starts each part in turn; while JetStream does not answer (a cluster electing leaders), a
   * part's start is tried again until it does (`patiently`) or `signal` aborts. A part that
   * fails to start: those started are stopped, and its failure is thrown.
   */
  async start(signal?: AbortSignal): Promise<void> {
    for (const part of this.list) {
      try {
        await patiently(part.name, async () => await part.start?.(), this.log, signal);
      } catch (err) {
        await this.stop();
        throw err;
      }
      this.started.push(part);
    }
  }

  /** Stops the parts started, the last first, each even when one before it failed (that failure is logged); safe to call twice. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      for (const part of [...this.started].reverse()) {
        try {
          await part.stop();
        } catch (err) {
          this.log.warn({ err, part: part.name }, "could not stop a part; stopping the others");
        }
      }
    })();
    return this.stopping;
  }
}
