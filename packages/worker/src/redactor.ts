/** What a secret value is replaced with wherever the worker writes agent output or results. */
export const REDACTED = "[redacted]";

const REDACTED_BYTES = new TextEncoder().encode(REDACTED);

/** Replaces every secret value in `text`. */
export function redactText(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const secret of secrets) out = out.replaceAll(secret, REDACTED);
  return out;
}

/** Replaces every secret value in the strings (keys included) of a JSON value. */
export function redactJson<T>(value: T, secrets: readonly string[]): T {
  if (secrets.length === 0) return value;
  const redact = (v: unknown): unknown => {
    if (typeof v === "string") return redactText(v, secrets);
    if (Array.isArray(v)) return v.map(redact);
    if (v !== null && typeof v === "object")
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [redactText(k, secrets), redact(x)]));
    return v;
  };
  return redact(value) as T;
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
