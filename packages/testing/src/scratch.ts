import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface Scratch extends AsyncDisposable {
  readonly path: string;
}

/** A new empty temporary folder, removed with everything in it when disposed. */
export async function scratch(prefix: string): Promise<Scratch> {
  const path = await mkdtemp(join(tmpdir(), prefix));
  return { path, [Symbol.asyncDispose]: () => rm(path, { recursive: true, force: true }) };
}
