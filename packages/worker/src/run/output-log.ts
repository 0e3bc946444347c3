import type { LogStream } from "@boxcar/protocol";
import type { Redactor, StreamRedactor } from "../workspace/redactor.js";
import { ProgressLines } from "./progress-lines.js";

/** The largest log message published; bigger output is split. */
export const MAX_LOG_CHUNK = 32 * 1024;

export interface OutputLogOptions {
  /** Stores one chunk; the log awaits each before publishing the next, so order is kept. */
  publish(stream: LogStream, data: Uint8Array): Promise<void>;
  /** Output kept per job, in bytes; the rest is dropped after one marker on stderr. */
  maxBytes: number;
  /** Takes the agent's secrets out of the output before it is published. */
  redactor: Pick<Redactor, "stream" | "text">;
  /** Called with the (redacted) message of each `::progress` line on stdout. */
  onProgress(message: string): void;
  onPublishError(err: unknown): void;
}

interface Pending {
  stream: LogStream;
  data: Uint8Array;
}

/**
 * The live output of one run: redacted, capped, published in order in chunks of at most
 * {@link MAX_LOG_CHUNK} bytes, and scanned for progress lines.
 */
export class OutputLog {
  private readonly redactors: Record<LogStream, StreamRedactor>;
  private readonly progress = new ProgressLines();
  private readonly queue: Pending[] = [];
  private pumping: Promise<void> | undefined;
  private kept = 0;
  private truncated = false;

  constructor(private readonly opts: OutputLogOptions) {
    this.redactors = { stdout: opts.redactor.stream(), stderr: opts.redactor.stream() };
  }

  write(stream: LogStream, chunk: Uint8Array): void {
    if (stream === "stdout") this.reportProgress(this.progress.push(chunk));
    this.keep(stream, this.redactors[stream].push(chunk));
  }

  /** Flushes what is held back and resolves once every chunk is stored. */
  async close(): Promise<void> {
    this.reportProgress(this.progress.end());
    this.keep("stdout", this.redactors.stdout.end());
    this.keep("stderr", this.redactors.stderr.end());
    await this.pumping;
  }

  private reportProgress(messages: string[]): void {
    for (const message of messages) this.opts.onProgress(this.opts.redactor.text(message));
  }

  private keep(stream: LogStream, data: Uint8Array): void {
    if (this.truncated || data.length === 0) return;
    const room = this.opts.maxBytes - this.kept;
    if (data.length <= room) {
      this.kept += data.length;
      this.enqueue(stream, data);
      return;
    }
    this.kept = this.opts.maxBytes;
    this.truncated = true;
    this.enqueue(stream, data.subarray(0, room));
    this.enqueue("stderr", new TextEncoder().encode(`\n[boxcar: output truncated after ${this.opts.maxBytes} bytes]\n`));
  }

  private enqueue(stream: LogStream, data: Uint8Array): void {
    if (data.length === 0) return;
    for (let at = 0; at < data.length; at += MAX_LOG_CHUNK) this.queue.push({ stream, data: data.subarray(at, at + MAX_LOG_CHUNK) });
    // pump() awaits before it can finish, so `pumping` is set before pump() clears it.
    this.pumping ??= this.pump();
  }

  private async pump(): Promise<void> {
    for (let next = this.take(); next; next = this.take()) {
      try {
        await this.opts.publish(next.stream, next.data);
      } catch (err) {
        this.opts.onPublishError(err);
      }
    }
    this.pumping = undefined;
  }

  /** The next chunk to publish: queued pieces of the same stream joined up to the chunk limit. */
  private take(): Pending | undefined {
    const first = this.queue.shift();
    if (!first) return undefined;
    const parts = [first.data];
    let size = first.data.length;
    for (let next = this.queue[0]; next?.stream === first.stream && size + next.data.length <= MAX_LOG_CHUNK; next = this.queue[0]) {
      parts.push(next.data);
      size += next.data.length;
      this.queue.shift();
    }
    return { stream: first.stream, data: parts.length === 1 ? first.data : Buffer.concat(parts, size) };
  }
}
