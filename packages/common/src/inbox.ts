import { createInbox, type NatsConnection } from "@nats-io/transport-node";

/**
 * A new inbox subject under the connection's inbox prefix (`_INBOX.<user>`), the only inboxes
 * its credential may subscribe to. nats.js keeps the prefix in the connection's options.
 */
export function newInbox(nc: NatsConnection): string {
  return createInbox((nc as NatsConnection & { options?: { inboxPrefix?: string } }).options?.inboxPrefix);
}
