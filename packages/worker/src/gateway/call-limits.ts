import { setTimeout as sleep } from "node:timers/promises";
import { isRevisionConflict } from "@boxcar/fabric/internal";
import type { ModelLimit, ModelProvider } from "@boxcar/protocol";
import type { KV } from "@nats-io/kv";

/**
 * The system policy's model limits (docs/models.md#limits), counted by every worker's gateway
 * together in NATS KV: one entry per limit and fixed window (`<provider>.<model>.<per>.<window>`,
 * the model's name in base64url, `_` for a whole provider's limit), holding the window's calls
 * and tokens, changed by compare-and-swap. A call is let through when every limit that applies
 * has room, and counted then; its tokens are added once its answer ended. So calls never pass a
 * limit of requests, while tokens can pass one by the calls already under way when it fills (a
 * call's size is known only at its end); the calls after it wait.
 */
export interface CallLimiter {
  /**
   * Waits for room under every limit that applies (up to the limit's `wait`): a ticket to spend
   * the call's tokens on, or the seconds until the window that has room, when the wait would be
   * longer (the call is refused: 429 with `retry-after`).
   */
  admit(provider: ModelProvider, model: string | undefined, signal: AbortSignal): Promise<{ ticket: string[] } | { retryAfterS: number }>;
  /** Adds a call's tokens to the windows it was let through in. */
  spend(ticket: string[], tokens: number): Promise<void>;
}

interface WindowUse {
  requests: number;
  tokens: number;
}

/** How many times a count is tried again when another gateway changed it first. */
const MAX_TRIES = 20;

export function kvCallLimiter(bucket: () => Promise<KV>, limits: readonly ModelLimit[]): CallLimiter {
  const applying = (provider: ModelProvider, model: string | undefined) =>
    limits.filter((l) => l.provider === provider && (l.model === undefined || l.model === model));
  const keyOf = (l: ModelLimit, window: number) =>
    `${l.provider}.${l.model ? Buffer.from(l.model).toString("base64url") : "_"}.${l.per}.${window}`;

  /** Counts one call in `limit`'s window now, if it has room: the key, or the ms until the next window. */
  const take = async (kv: KV, limit: ModelLimit): Promise<{ key: string } | { waitMs: number }> => {
    for (let tries = 0; tries < MAX_TRIES; tries++) {
      const now = Date.now();
      const window = Math.floor(now / limit.per);
      const key = keyOf(limit, window);
      const entry = await kv.get(key);
      const use: WindowUse = entry?.operation === "PUT" ? (entry.json() as WindowUse) : { requests: 0, tokens: 0 };
      const full =
        (limit.requests !== undefined && use.requests >= limit.requests) || (limit.tokens !== undefined && use.tokens >= limit.tokens);
      if (full) return { waitMs: (window + 1) * limit.per - now };
      const next = JSON.stringify({ requests: use.requests + 1, tokens: use.tokens });
      try {
        if (entry?.operation === "PUT") await kv.update(key, next, entry.revision);
        else await kv.create(key, next);
        return { key };
      } catch (err) {
        if (!isRevisionConflict(err)) throw err;
      }
    }
    throw new Error("the model limits' count kept changing; try again");
  };

  return {
    async admit(provider, model, signal) {
      const kv = await bucket();
      const ticket: string[] = [];
      for (const limit of applying(provider, model)) {
        const waitUntil = Date.now() + limit.wait;
        for (;;) {
          const taken = await take(kv, limit);
          if ("key" in taken) {
            if (limit.tokens !== undefined) ticket.push(taken.key);
            break;
          }
          if (Date.now() + taken.waitMs > waitUntil) return { retryAfterS: Math.max(1, Math.ceil(taken.waitMs / 1000)) };
          await sleep(taken.waitMs + 5, undefined, { signal });
        }
      }
      return { ticket };
    },

    async spend(ticket, tokens) {
      if (tokens === 0 || ticket.length === 0) return;
      const kv = await bucket();
      for (const key of ticket) {
        for (let tries = 0; tries < MAX_TRIES; tries++) {
          const entry = await kv.get(key);
          if (entry?.operation !== "PUT") break;
          const use = entry.json() as WindowUse;
          try {
            await kv.update(key, JSON.stringify({ requests: use.requests, tokens: use.tokens + tokens }), entry.revision);
            break;
          } catch (err) {
            if (!isRevisionConflict(err)) throw err;
          }
        }
      }
    },
  };
}
