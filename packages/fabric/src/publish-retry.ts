/**
 * Publishing that rides out a server restart: `js.publish` (and so every KV and Object Store
 * write made through it) tried again for a while when it may not have been stored, only where
 * sending twice is safe. `openTopology` wraps the system's JetStream client with it.
 */

import type { JetStreamClient } from "@nats-io/jetstream";
import { errors as natsErrors } from "@nats-io/transport-node";
import { isNoResponders } from "./nats-errors.js";

/**
 * How long a JetStream publish is tried again when it may not have been stored:
 * - no stream answered ("no responders"): a server that has just restarted takes clients before
 *   its streams are back. Nothing was stored, so sending again is always safe.
 * - no acknowledgement in time (a timeout, e.g. the client's server died with the request in
 *   flight): the message may have been stored, so it is sent again only when it carries a
 *   message id (`msgID`), which makes the stream drop a second copy. A compare-and-swap write
 *   (KV update) has none and is not repeated.
 */
const PUBLISH_RETRY_MS = 10_000;

/** Makes `js.publish` (and so KV and Object Store writes through `js`) ride out a server restart. */
export function retryingPublish(js: JetStreamClient): JetStreamClient {
  const publish = js.publish.bind(js);
  js.publish = async (subject, payload, options) => {
    const deadline = Date.now() + PUBLISH_RETRY_MS;
    for (let delayMs = 25; ; delayMs = Math.min(delayMs * 2, 1_000)) {
      try {
        return await publish(subject, payload, options);
      } catch (err) {
        const again = isNoResponders(err) || (err instanceof natsErrors.TimeoutError && options?.msgID !== undefined);
        if (!again || Date.now() + delayMs > deadline) throw err;
        await new Promise((r) => setTimeout(r, delayMs));
      }
    }
  };
  return js;
}
