import { errors as natsErrors } from "@nats-io/transport-node";

/** nats.js reports a publish nobody answered as "JetStream not enabled", caused by a no-responders error. */
export function isNoResponders(err: unknown): boolean {
  const cause = err instanceof Error ? err.cause : undefined;
  return cause instanceof natsErrors.RequestError && cause.isNoResponders();
}

/**
 * True for errors that say NATS could not be reached or did not answer in time (a server
 * restarting, a connection lost or closing), as opposed to an answer that refuses the request.
 * Work that failed this way may be tried again; it says nothing about the job itself.
 */
export function isTransientNatsError(err: unknown): boolean {
  return (
    err instanceof natsErrors.TimeoutError ||
    err instanceof natsErrors.ConnectionError ||
    err instanceof natsErrors.ClosedConnectionError ||
    err instanceof natsErrors.DrainingConnectionError ||
    err instanceof natsErrors.NoRespondersError ||
    isNoResponders(err) ||
    (err instanceof Error && err.cause !== undefined && err.cause !== err && isTransientNatsError(err.cause))
  );
}
