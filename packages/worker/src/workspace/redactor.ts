import type { Logger } from "@boxcar/common";

/** What a secret value is replaced with wherever the worker writes agent output or results. */
export const REDACTED = "[redacted]";

const REDACTED_BYTES = new TextEncoder().encode(REDACTED);

/**
 * The shortest piece of a secret that is redacted on its own in what an agent reports (a result,
 * an error, a usage line, an event): a report cut short (a parser's message quoting the start of
 * a bad file, a field cut at its limit) must not carry its first characters out.
 */
const SECRET_PIECE = 8;

/**
 * The one place where the secrets an attempt's agent was given are taken out of everything the
 * worker writes of it: its record, its events (usage and progress included), its live output, its
 * artifacts' names and contents, the answers to its signals, and the worker's own log lines about
 * it. Objects are redacted whole, every string and key, so that a new field cannot be missed.
 *
 * In a string, a secret is replaced wherever it appears, and so is any piece of it of
 * {@link SECRET_PIECE} characters or more, and its common encodings ({@link encodingsOf}). A byte stream (live output, an artifact) is cut
 * into chunks anywhere, so only whole secrets are replaced there (a piece could straddle chunks).
 * Redaction keeps out what an agent lets slip, not what it sets out to hide: an agent that
 * encodes a secret (base64, say) carries it past any redactor. Keeping the secret out of the
 * sandbox is the model gateway's work.
 */
export class Redactor {
  private secrets: string[] = [];
  /** Every piece of {@link SECRET_PIECE} characters of every secret that long. */
  private pieces = new Set<string>();

  constructor(secrets: Iterable<string> = []) {
    this.add(secrets);
  }

  /** Redacts `secrets` too from now on, and their common encodings (an attempt learns its secrets once it is claimed). */
  add(secrets: Iterable<string>): void {
    const plain = [...secrets].filter((s) => s.length > 0);
    // Longest first, so a secret that contains another is replaced whole.
    this.secrets = [...new Set([...this.secrets, ...plain, ...plain.flatMap(encodingsOf)])].sort((a, b) => b.length - a.length);
    for (const secret of plain) {
      for (let i = 0; i + SECRET_PIECE <= secret.length; i++) this.pieces.add(secret.slice(i, i + SECRET_PIECE));
    }
  }

  get active(): boolean {
    return this.secrets.length > 0;
  }

  /** `text` with every secret, and every piece of one, replaced. */
  text(text: string): string {
    if (!this.active) return text;
    let out = text;
    for (const secret of this.secrets) out = out.replaceAll(secret, REDACTED);
    return this.pieces.size > 0 ? this.withoutPieces(out) : out;
  }

  /** The strings (keys included) of a JSON-like value, redacted; the value itself when there is nothing to redact. */
  json<T>(value: T): T {
    if (!this.active) return value;
    const redact = (v: unknown): unknown => {
      if (typeof v === "string") return this.text(v);
      if (Array.isArray(v)) return v.map(redact);
      // An error's own fields too (its code, say), and its cause.
      if (v instanceof Error)
        return redact({
          ...Object.fromEntries(Object.entries(v)),
          name: v.name,
          message: v.message,
          stack: v.stack,
          ...(v.cause !== undefined ? { cause: v.cause } : {}),
        });
      if (v !== null && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [this.text(k), redact(x)]));
      return v;
    };
    return redact(value) as T;
  }

  /** A redactor of one byte stream (whole secrets only). */
  stream(): StreamRedactor {
    return new StreamRedactor(this.secrets);
  }

  /** `log` with every line it writes redacted (objects, errors and messages). */
  logger(log: Logger): Logger {
    const line =
      (write: (obj: object, msg?: string) => void) =>
      (obj: object, msg?: string): void =>
        this.active ? write(this.json(obj), msg === undefined ? undefined : this.text(msg)) : write(obj, msg);
    return {
      debug: line((o, m) => log.debug(o, m)),
      info: line((o, m) => log.info(o, m)),
      warn: line((o, m) => log.warn(o, m)),
      error: line((o, m) => log.error(o, m)),
      child: (bindings) => this.logger(log.child(bindings)),
    };
  }

  /** `text` with every run of characters covered by pieces of a secret replaced by one marker. */
  private withoutPieces(text: string): string {
    let out = "";
    let from = 0;
    let i = 0;
    while (i + SECRET_PIECE <= text.length) {
      if (!this.pieces.has(text.slice(i, i + SECRET_PIECE))) {
        i++;
        continue;
      }
      // A run of overlapping pieces is one stretch of a secret.
      let end = i + SECRET_PIECE;
      while (end < text.length && this.pieces.has(text.slice(end - SECRET_PIECE + 1, end + 1))) end++;
      out += text.slice(from, i) + REDACTED;
      from = end;
      i = end;
    }
    return from === 0 ? text : out + text.slice(from);
  }
}

/**
 * The forms a secret is commonly printed in besides its own (`base64`, `xxd -p`, a URL): its
 * base64 and base64url, as the part every encoding of a text holding it shares whatever bytes
 * come before it (three, one for each alignment: the 4-character groups made of its bytes alone),
 * its hex in either case, and its URL-encoding. Forms shorter than {@link SECRET_PIECE} are left
 * out: they would match too much else. An encoding wrapped across lines (`base64` wraps at 76
 * columns) is not recognised where the wrap falls inside it.
 */
export function encodingsOf(secret: string): string[] {
  const bytes = Buffer.from(secret);
  const forms = new Set<string>();
  for (let before = 0; before < 3; before++) {
    const b64 = Buffer.concat([Buffer.alloc(before), bytes]).toString("base64");
    // The groups of three bytes wholly within the secret: the first is shared with the bytes
    // before it unless there are none, the last with those after it unless it is whole.
    const core = b64.slice(before > 0 ? 4 : 0, Math.floor((before + bytes.length) / 3) * 4);
    forms.add(core);
    forms.add(core.replaceAll("+", "-").replaceAll("/", "_"));
  }
  forms.add(bytes.toString("hex"));
  forms.add(bytes.toString("hex").toUpperCase());
  forms.add(encodeURIComponent(secret));
  forms.delete(secret);
  return [...forms].filter((form) => form.length >= SECRET_PIECE);
}

/**
 * Replaces secret values in a byte stream cut into arbitrary chunks. It holds back the end of a
 * chunk only while that end could be the start of a secret.
 */
export class StreamRedactor {
  private readonly secrets: Buffer[];
  private pending: Buffer = Buffer.alloc(0);

  constructor(secrets: readonly string[]) {
    // Longest first, so a secret that contains another is replaced whole.
    this.secrets = secrets
      .filter((s) => s.length > 0)
      .map((s) => Buffer.from(s))
      .sort((a, b) => b.length - a.length);
  }

  push(chunk: Uint8Array): Uint8Array {
    if (this.secrets.length === 0) return chunk;
    const data =
      this.pending.length > 0 ? Buffer.concat([this.pending, chunk]) : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    const parts: Uint8Array[] = [];
    let pos = 0;
    for (;;) {
      const next = this.nextSecret(data, pos);
      if (!next) break;
      parts.push(data.subarray(pos, next.at), REDACTED_BYTES);
      pos = next.at + next.length;
    }
    const rest = data.subarray(pos);
    const hold = this.partialSecretAtEnd(rest);
    parts.push(rest.subarray(0, rest.length - hold));
    this.pending = Buffer.from(rest.subarray(rest.length - hold));
    return Buffer.concat(parts);
  }

  /** What is still held back: at the end of the stream it is no secret. */
  end(): Uint8Array {
    const rest = this.pending;
    this.pending = Buffer.alloc(0);
    return rest;
  }

  private nextSecret(data: Buffer, from: number): { at: number; length: number } | undefined {
    let best: { at: number; length: number } | undefined;
    for (const secret of this.secrets) {
      const at = data.indexOf(secret, from);
      if (at >= 0 && (!best || at < best.at)) best = { at, length: secret.length };
    }
    return best;
  }

  /** The length of the longest end of `data` that is the beginning of a secret. */
  private partialSecretAtEnd(data: Buffer): number {
    let longest = 0;
    for (const secret of this.secrets) {
      for (let n = Math.min(secret.length - 1, data.length); n > longest; n--) {
        if (data.subarray(data.length - n).equals(secret.subarray(0, n))) {
          longest = n;
          break;
        }
      }
    }
    return longest;
  }
}
