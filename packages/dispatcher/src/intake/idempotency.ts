import { createHash } from "node:crypto";
import type { KV } from "@nats-io/kv";

/** How many times a claim is tried when its create fails and no one holds the key. */
const MAX_TRIES = 5;

/**
 * Claims an idempotency key for job `id` in the idempotency bucket; returns the job id that owns
 * the key, `id` or an earlier submission's. Only ever a create (a compare-and-swap, also over a
 * delete marker): a create that fails, even on a timeout whose outcome is unknown, is followed by
 * a read, and the owner read wins; with no owner, the create is tried again. Two submissions of
 * one key therefore get one job between them, whatever fails in between.
 */
export async function claimKey(idempotency: KV, key: string, id: string): Promise<string> {
  const hashed = createHash("sha256").update(key).digest("hex");
  let lastErr: unknown;
  for (let tries = 0; tries < MAX_TRIES; tries++) {
    try {
      await idempotency.create(hashed, id);
      return id;
    } catch (err) {
      lastErr = err;
    }
    const entry = await idempotency.get(hashed);
    if (entry?.operation === "PUT") return entry.string();
  }
  throw lastErr;
}
