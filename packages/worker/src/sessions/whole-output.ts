import { removeObject } from "@boxcar/fabric/internal";
import type { KeptOutput, OutputStream } from "@boxcar/protocol";
import { keptOutputObject, keptOutputSizes, MAX_KEPT_OUTPUT, SESSION_OUTPUT_SEGMENT } from "@boxcar/protocol/internal";

/** Where a command's whole output is kept: the Object Store, one object per segment. */
export interface OutputStore {
  putBlob(meta: { name: string }, data: Uint8Array): Promise<unknown>;
}

/** How much of each stream was kept whole, and whether the end was cut off past `MAX_KEPT_OUTPUT`. */
export type KeptSizes = Partial<Record<OutputStream, { bytes: number; cut?: boolean }>>;

/**
 * A session command's whole output (docs/sessions.md#whole-output), kept once it writes more than
 * the live window: each stream in segments of `SESSION_OUTPUT_SEGMENT` bytes, each stored as an
 * object (`keptOutputObject`) once full, and the last one when the command ends. A command that
 * stays within the window stores nothing (its live output is whole). Each stream is kept up to
 * `MAX_KEPT_OUTPUT` bytes; past that its end is cut, and the reply says so.
 */
export class WholeOutput {
  private readonly streams: Record<OutputStream, StreamSegments>;
  /** Full segments held back until the window is passed. */
  private readonly held: Record<OutputStream, { index: number; data: Uint8Array }[]> = { stdout: [], stderr: [] };
  private keeping = false;
  private readonly writes: Promise<unknown>[] = [];

  constructor(
    private readonly store: OutputStore,
    private readonly session: string,
    private readonly execId: string,
  ) {
    this.streams = { stdout: new StreamSegments(), stderr: new StreamSegments() };
  }

  /** A redacted chunk of `stream`. */
  push(stream: OutputStream, chunk: Uint8Array): void {
    for (const full of this.streams[stream].push(chunk)) {
      if (this.keeping) this.write(stream, full.index, full.data);
      else this.held[stream].push(full);
    }
  }

  /** The live window is passed: from now on full segments are stored, the ones held so far first. */
  keep(): void {
    if (this.keeping) return;
    this.keeping = true;
    for (const stream of ["stdout", "stderr"] as const) {
      for (const full of this.held[stream].splice(0)) this.write(stream, full.index, full.data);
    }
  }

  /** The command ended: the last segments stored (if kept at all); how much each stream kept. */
  async end(): Promise<KeptSizes | undefined> {
    if (!this.keeping) return undefined;
    const sizes: KeptSizes = {};
    for (const stream of ["stdout", "stderr"] as const) {
      const segments = this.streams[stream];
      const last = segments.takeRest();
      if (last) this.write(stream, last.index, last.data);
      if (segments.bytes > 0) sizes[stream] = { bytes: segments.bytes, ...(segments.cut ? { cut: true } : {}) };
    }
    await Promise.all(this.writes);
    // What was kept, for readers that come later (sessions.output).
    await this.store.putBlob({ name: keptOutputSizes(this.session, this.execId) }, new TextEncoder().encode(JSON.stringify(sizes)));
    return sizes;
  }

  private write(stream: OutputStream, index: number, data: Uint8Array): void {
    this.writes.push(this.store.putBlob({ name: keptOutputObject(this.session, this.execId, stream, index) }, data));
  }
}

/** One stream's bytes, cut into segments. */
class StreamSegments {
  private current: Uint8Array[] = [];
  private currentBytes = 0;
  private index = 0;
  bytes = 0;
  cut = false;

  /** Adds a chunk; the segments it filled. */
  push(chunk: Uint8Array): { index: number; data: Uint8Array }[] {
    let rest = chunk.subarray(0, Math.max(0, MAX_KEPT_OUTPUT - this.bytes));
    if (rest.length < chunk.length) this.cut = true;
    this.bytes += rest.length;
    const filled: { index: number; data: Uint8Array }[] = [];
    while (rest.length > 0) {
      const take = rest.subarray(0, SESSION_OUTPUT_SEGMENT - this.currentBytes);
      this.current.push(take);
      this.currentBytes += take.length;
      rest = rest.subarray(take.length);
      if (this.currentBytes === SESSION_OUTPUT_SEGMENT) filled.push(this.close());
    }
    return filled;
  }

  /** The segment being filled, if it has anything. */
  takeRest(): { index: number; data: Uint8Array } | undefined {
    return this.currentBytes > 0 ? this.close() : undefined;
  }

  private close(): { index: number; data: Uint8Array } {
    const segment = { index: this.index++, data: Buffer.concat(this.current, this.currentBytes) };
    this.current = [];
    this.currentBytes = 0;
    return segment;
  }
}

/** Removes the whole outputs a session kept (it closes): every segment of each command's streams. */
export async function removeKeptOutput(
  topology: Parameters<typeof removeObject>[0],
  session: string,
  kept: readonly { execId: string; kept: KeptOutput }[],
): Promise<void> {
  for (const { execId, kept: streams } of kept) {
    for (const [stream, size] of Object.entries(streams) as [OutputStream, { bytes: number }][]) {
      const segments = Math.ceil(size.bytes / SESSION_OUTPUT_SEGMENT);
      for (let index = 0; index < segments; index++) await removeObject(topology, keptOutputObject(session, execId, stream, index));
    }
    await removeObject(topology, keptOutputSizes(session, execId));
  }
}
