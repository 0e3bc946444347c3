import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "@boxcar/common";
import { JetStreamApiCodes, JetStreamApiError } from "@nats-io/jetstream";
import { errors as natsErrors } from "@nats-io/transport-node";

/** Whether `err` or an error it was caused by passes `test`. */
function anyCause(err: unknown, test: (e: Error) => boolean): boolean {
  for (let e = err; e instanceof Error; e = e.cause === e ? undefined : e.cause) if (test(e)) return true;
  return false;
}

/** Whether JetStream answered an API request with one of `codes`, somewhere in `err`'s causes. */
const jetStreamAnswered = (err: unknown, codes: readonly number[]) =>
  anyCause(err, (e) => e instanceof JetStreamApiError && codes.includes(e.code));

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

/** JetStream's "system temporarily unavailable": no meta leader (say, a server paused or restarting). */
const TEMPORARILY_UNAVAILABLE = 10008;

/**
 * True for what a recovering cluster answers for a while: no answer in time, no responders, no
 * meta leader. Anything else (a refusal, a configuration the server rejects) is not transient.
 */
export function isTransientJetStreamError(err: unknown): boolean {
  return jetStreamAnswered(err, [TEMPORARILY_UNAVAILABLE]) || isTransientNatsError(err);
}

/** JetStream's refusals for want of storage: "insufficient resources" and "insufficient storage resources available". */
const STORAGE_REFUSALS: readonly number[] = [10023, 10047];

/** True when JetStream refused a write because its store (the server's or the account's) has no room left. */
export function isStorageFull(err: unknown): boolean {
  return jetStreamAnswered(err, STORAGE_REFUSALS);
}

/** JetStream's "no message found" (and "stream store EOF", past the last sequence): a message asked for by sequence is not there. */
const NO_MESSAGE = 10057;

/** True when JetStream answered that the message asked for (by sequence) is not in the stream. */
export function isNoMessage(err: unknown): boolean {
  return jetStreamAnswered(err, [NO_MESSAGE]);
}

/** Whether `err` (or a cause of it) is NATS refusing what the connection's permissions do not allow. */
export function isPermissionViolation(err: unknown): boolean {
  return anyCause(err, (e) => e instanceof natsErrors.PermissionViolationError);
}

const MAX_BACKOFF_MS = 5_000;

/**
 * Runs `step` until it succeeds, waiting out transient JetStream answers (see
 * `isTransientJetStreamError`) with backoff from 250 ms to 5 s. The wait is logged once when it
 * starts and once when it ends; any other error, or an abort, is thrown at once. Roles start
 * with it, so one started while its cluster recovers waits instead of exiting.
 */
export async function patiently<T>(
  what: string,
  step: () => Promise<T>,
  log: Logger,
  signal?: AbortSignal,
  opts: { untilRoom?: boolean } = {},
): Promise<T> {
  let delay = 250;
  let since: number | undefined;
  for (;;) {
    try {
      const value = await step();
      if (since !== undefined) log.info({ what, waitedMs: Date.now() - since }, `${what}: JetStream answers again`);
      return value;
    } catch (err) {
      // `untilRoom`: a write refused for want of storage is waited out too (retention, `boxcar
      // clean` or an operator may free some), where a role would otherwise exit.
      const full = opts.untilRoom === true && isStorageFull(err);
      if (!full && !isTransientJetStreamError(err)) throw err;
      signal?.throwIfAborted();
      if (since === undefined) {
        since = Date.now();
        log.warn(
          { what, err: (err as Error).message },
          full ? `${what}: JetStream's store is full; waiting for room` : `${what}: JetStream does not answer yet; waiting for it`,
        );
      }
      // An abort ends the pause at once and is thrown as it is.
      await sleep(delay, undefined, signal ? { signal } : {}).catch(() => signal?.throwIfAborted());
      signal?.throwIfAborted();
      delay = Math.min(delay * 2, MAX_BACKOFF_MS);
    }
  }
}

/** A compare-and-swap write that lost: the key changed since the revision it was made against. */
export function isRevisionConflict(err: unknown): boolean {
  return (
    err instanceof JetStreamApiError &&
    (err.code === JetStreamApiCodes.StreamWrongLastSequence || err.code === JetStreamApiCodes.StreamWrongLastSequenceUnknown)
  );
}

/** JetStream's answer for a stream, consumer or message that does not exist. */
export function isNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && (err.status === 404 || err.code === 10014 || err.code === 10059);
}
