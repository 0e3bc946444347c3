/**
 * The backup file's format (docs/backup.md): gzip'd JSON lines, a header, then for each stream of
 * the prefix its config line, its messages (sequence, subject, headers, data) oldest first, and a
 * trailer with their count; then a last line that says the file is complete. Owns the format's name
 * and version, the lines' shapes and schemas, the gzip line writer (`LineWriter`) and reader
 * (`linesOf`), and `BackupFileError`: a file that cannot be written or read, or is not a backup this
 * release can restore.
 */

import { once } from "node:events";
import { createReadStream } from "node:fs";
import { type FileHandle, open, rm } from "node:fs/promises";
import { pipeline } from "node:stream/promises";
import { StringDecoder } from "node:string_decoder";
import { createGunzip, createGzip, type Gzip } from "node:zlib";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { z } from "zod";

/** What the first line of every backup says it is. */
export const BACKUP_FORMAT = "boxcar-backup";
/** The version of the file's layout this release writes and reads. */
export const BACKUP_VERSION = 1;

export const MiB = 1024 * 1024;

/** A backup file that cannot be read, or is not one this release can restore; nothing was made. */
export class BackupFileError extends BoxcarError {
  override readonly name = "BackupFileError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(ErrorCode.invalid, message, options);
  }
}

export interface MessageLine {
  seq: number;
  subject: string;
  /** When the message was stored at the source (a restored one is stored anew, at the restore's time). */
  time: string;
  headers?: Record<string, string[]>;
  /** The data, when it is UTF-8 text (JSON records, events, logs). */
  text?: string;
  /** The data otherwise (file chunks), base64. */
  base64?: string;
}

export function headerBytes(headers: Record<string, string[]> | undefined): number {
  let n = 0;
  for (const [key, values] of Object.entries(headers ?? {})) for (const v of values) n += key.length + v.length + 4;
  return n;
}

/** Gzip'd JSON lines to a file made with mode 0600, with backpressure. */
export class LineWriter {
  private failure: unknown;

  private constructor(
    private readonly gzip: Gzip,
    private readonly done: Promise<void>,
  ) {
    done.catch((err: unknown) => {
      this.failure = err;
    });
  }

  static async open(path: string): Promise<LineWriter> {
    // A file left by an earlier cut-short run may have another mode: start afresh.
    await rm(path, { force: true });
    let handle: FileHandle;
    try {
      handle = await open(path, "wx", 0o600);
    } catch (err) {
      throw new BackupFileError(`cannot write ${path}: ${(err as Error).message}`, { cause: err });
    }
    const gzip = createGzip();
    return new LineWriter(gzip, pipeline(gzip, handle.createWriteStream()));
  }

  async write(value: object): Promise<void> {
    if (this.failure) throw this.failure;
    if (!this.gzip.write(`${JSON.stringify(value)}\n`)) await once(this.gzip, "drain");
  }

  async close(): Promise<void> {
    this.gzip.end();
    await this.done;
  }

  async abort(): Promise<void> {
    this.gzip.destroy();
    await this.done.catch(() => {});
  }
}

export const Header = z.object({
  format: z.literal(BACKUP_FORMAT),
  version: z.number(),
  prefix: z.string(),
  createdAt: z.string(),
  streams: z.array(z.string()),
});
export const StreamLine = z.object({
  type: z.literal("stream"),
  name: z.string(),
  config: z.looseObject({ name: z.string(), subjects: z.array(z.string()) }),
  state: z.looseObject({ first_seq: z.number(), last_seq: z.number(), messages: z.number() }),
});
const HEADER_NAME = /^[!-9;-~]+$/;
export const Message = z
  .object({
    seq: z.number().int().positive(),
    subject: z.string().regex(/^[^\s]+$/),
    time: z.string().optional(),
    headers: z.record(z.string().regex(HEADER_NAME), z.array(z.string().regex(/^[^\r\n]*$/))).optional(),
    text: z.string().optional(),
    base64: z
      .string()
      .regex(/^[A-Za-z0-9+/]*={0,2}$/)
      .optional(),
  })
  .refine((m) => (m.text === undefined) !== (m.base64 === undefined), "a message has its data as text or as base64");
export const EndLine = z.object({
  type: z.literal("end"),
  stream: z.string(),
  messages: z.number().int().nonnegative(),
  bytes: z.number().nonnegative(),
  lastSeq: z.number().int().nonnegative(),
});
export const DoneLine = z.object({
  type: z.literal("done"),
  streams: z.number().int().nonnegative(),
  messages: z.number().int().nonnegative(),
  bytes: z.number().nonnegative(),
});
export type Message = z.infer<typeof Message>;

/** The longest line a backup may have: a 1 MiB message in base64 with headers, and room to spare. */
const MAX_LINE = 16 * MiB;

/** The lines of a gzip'd file, with their numbers; a file that is not gzip, is cut short or corrupt is a `BackupFileError`. */
export async function* linesOf(file: string): AsyncGenerator<{ n: number; text: string }> {
  let magic: Buffer;
  try {
    const handle = await open(file, "r");
    try {
      magic = Buffer.alloc(2);
      const { bytesRead } = await handle.read(magic, 0, 2, 0);
      magic = magic.subarray(0, bytesRead);
    } finally {
      await handle.close();
    }
  } catch (err) {
    throw new BackupFileError(`cannot read ${file}: ${(err as Error).message}`, { cause: err });
  }
  if (magic.length < 2 || magic[0] !== 0x1f || magic[1] !== 0x8b) {
    throw new BackupFileError(`${file} is not a Boxcar backup: it is not gzip data (boxcar backup writes gzip'd JSON lines)`);
  }
  const source = createReadStream(file);
  const gunzip = createGunzip();
  source.on("error", (err) => gunzip.destroy(err));
  source.pipe(gunzip);
  const decoder = new StringDecoder("utf8");
  let rest = "";
  let n = 0;
  try {
    for await (const chunk of gunzip) {
      rest += decoder.write(chunk as Buffer);
      const lines = rest.split("\n");
      rest = lines.pop() ?? "";
      for (const text of lines) {
        n += 1;
        yield { n, text };
      }
      if (rest.length > MAX_LINE) throw new BackupFileError(`${file} is corrupt: line ${n + 1} is longer than ${MAX_LINE} characters`);
    }
  } catch (err) {
    if (err instanceof BackupFileError) throw err;
    const code = (err as { code?: string }).code;
    if (code === "Z_BUF_ERROR" || /unexpected end of file/i.test((err as Error).message)) {
      throw new BackupFileError(
        `${file} is truncated: its compressed data ends early (the backup was cut short, or the copy is incomplete)`,
        {
          cause: err,
        },
      );
    }
    if (code?.startsWith("Z_")) throw new BackupFileError(`${file} is corrupt: ${(err as Error).message}`, { cause: err });
    throw new BackupFileError(`cannot read ${file}: ${(err as Error).message}`, { cause: err });
  } finally {
    source.destroy();
  }
  rest += decoder.end();
  if (rest !== "") throw new BackupFileError(`${file} is truncated: its last line (${n + 1}) is incomplete`);
}

/** Parses one line as JSON, or says which line of which file is not. */
export function parseLine(file: string, n: number, text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new BackupFileError(`${file} is corrupt: line ${n} is not JSON`);
  }
}

export function checked<T>(schema: z.ZodType<T>, value: unknown, file: string, n: number, what: string): T {
  const parsed = schema.safeParse(value);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  throw new BackupFileError(`${file} is corrupt: line ${n} is not a valid ${what} (${issue?.path.join(".") || "line"}: ${issue?.message})`);
}

export function dataOf(msg: Message): Uint8Array {
  return msg.text !== undefined ? Buffer.from(msg.text, "utf8") : Buffer.from(msg.base64 ?? "", "base64");
}
