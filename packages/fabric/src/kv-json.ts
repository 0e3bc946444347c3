import { parseWith } from "@boxcar/protocol";
import type { KV, KvEntry, KvWatchOptions } from "@nats-io/kv";
import type { z } from "zod";

export interface Revisioned<T> {
  value: T;
  /** The KV revision, for a compare-and-swap `kv.update(key, value, revision)`. */
  revision: number;
}

/**
 * Hands `take` every entry of `kv` the watch brings (by default the current values, then each
 * change) until the returned function stops it: how a role keeps a bucket in memory.
 */
export async function followKv(kv: KV, take: (entry: KvEntry) => void, opts: KvWatchOptions = {}): Promise<() => void> {
  const watch = await kv.watch(opts);
  void (async () => {
    for await (const entry of watch) take(entry);
  })();
  return () => watch.stop();
}

/** Reads a JSON value from KV and validates it; `null` when the key is absent or deleted. */
export async function getJson<S extends z.ZodType>(kv: KV, key: string, schema: S, what: string): Promise<Revisioned<z.infer<S>> | null> {
  const entry = await kv.get(key);
  if (entry?.operation !== "PUT") return null;
  return { value: parseWith(schema, entry.json(), `${what} ${key}`), revision: entry.revision };
}

/**
 * The bucket's keys, each once, in key order. KV's `keys()` reads them with a consumer that also
 * delivers what is written meanwhile, so a key written while they are read comes twice.
 */
export async function keysOf(kv: KV): Promise<string[]> {
  const keys = new Set<string>();
  for await (const key of await kv.keys()) keys.add(key);
  return [...keys].sort();
}

/** Every value of a bucket, validated, in key order. */
export async function listJson<S extends z.ZodType>(kv: KV, schema: S, what: string): Promise<z.infer<S>[]> {
  const values: z.infer<S>[] = [];
  for (const key of await keysOf(kv)) {
    const found = await getJson(kv, key, schema, what);
    if (found) values.push(found.value);
  }
  return values;
}
