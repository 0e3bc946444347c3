const PREFIX = "::progress ";
const PREFIX_BYTES = new TextEncoder().encode(PREFIX);
/** The longest progress message, in characters. */
export const MAX_PROGRESS_CHARS = 1024;
/** Enough bytes of a line for the prefix and the longest message (4 bytes per character at most). */
const HEAD_BYTES = PREFIX_BYTES.length + 4 * MAX_PROGRESS_CHARS;
const NEWLINE = 0x0a;

/**
 * Finds `::progress <message>` lines in output that arrives in arbitrary chunks. Only the start
 * of each line is kept, so a long line costs no memory.
 */
export class ProgressLines {
  private head: Uint8Array[] = [];
  private headBytes = 0;

  /** The messages of the progress lines that `chunk` completes. */
  push(chunk: Uint8Array): string[] {
    const messages: string[] = [];
    let start = 0;
    for (let nl = chunk.indexOf(NEWLINE); nl >= 0; nl = chunk.indexOf(NEWLINE, start)) {
      this.keep(chunk.subarray(start, nl));
      this.endLine(messages);
      start = nl + 1;
    }
    this.keep(chunk.subarray(start));
    return messages;
  }

  /** The message of an unterminated last line, if it is a progress line. */
  end(): string[] {
    const messages: string[] = [];
    if (this.headBytes > 0) this.endLine(messages);
    return messages;
  }

  private keep(part: Uint8Array): void {
    const room = HEAD_BYTES - this.headBytes;
    if (room <= 0 || part.length === 0) return;
    const kept = part.subarray(0, room);
    this.head.push(kept.slice());
    this.headBytes += kept.length;
  }

  private endLine(messages: string[]): void {
    const line = Buffer.concat(this.head, this.headBytes);
    this.head = [];
    this.headBytes = 0;
    if (!line.subarray(0, PREFIX_BYTES.length).equals(PREFIX_BYTES)) return;
    const text = line.subarray(PREFIX_BYTES.length).toString("utf8").replace(/\r$/, "");
    messages.push(Array.from(text).slice(0, MAX_PROGRESS_CHARS).join(""));
  }
}
