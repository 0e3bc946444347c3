import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";

/** Whether a subscription was refused: it gets an error and no message. */
export type Refused = (err: Error | null) => boolean;

/**
 * How a worker tells a subscription the server refused (credentials from before it: push the
 * account): logged, never read. `refusedBy(log)("cancels")` is the check of the cancels'.
 */
export function refusedBy(log: Logger): (what: string) => Refused {
  return (what) => (err) => {
    if (err) log.error({ err }, `cannot listen for ${what}: push the account again (boxcar auth push)`);
    return err !== null;
  };
}

/** Hands each cancel of the system's jobs (`<prefix>.ctl.cancel.<jobId>`) to `cancel`, with its job's id. */
export function listenForCancels(topology: Topology, refused: Refused, cancel: (jobId: string) => void): Subscription {
  const cancelPrefix = topology.names.subjects.cancel("");
  return topology.nc.subscribe(topology.names.subjects.cancelAll, {
    callback: (err, msg) => {
      if (!refused(err)) cancel(msg.subject.slice(cancelPrefix.length));
    },
  });
}

/** The workers taking signals on each connection, and the one subscription they share. */
const signalListeners = new WeakMap<NatsConnection, { sub: Subscription; takers: Set<(msg: Msg) => boolean> }>();

/**
 * Hands the signals of `topology`'s system to `take`, with their job's id (true: its worker runs
 * the job, and answers), through one subscription per connection, whatever the number of workers
 * on it: a request delivered once per worker's subscription could be answered by none of them on
 * a server with authentication, which lets a client answer a request once. Returns how to stop.
 */
export function listenForSignals(topology: Topology, refused: Refused, take: (jobId: string, msg: Msg) => boolean): () => void {
  const signalPrefix = topology.names.subjects.signal("");
  const taker = (msg: Msg) => take(msg.subject.slice(signalPrefix.length), msg);
  let listening = signalListeners.get(topology.nc);
  if (!listening) {
    const takers = new Set<(msg: Msg) => boolean>();
    const sub = topology.nc.subscribe(topology.names.subjects.signalAll, {
      callback: (err, msg) => {
        if (refused(err)) return;
        for (const taker of takers) if (taker(msg)) return;
      },
    });
    listening = { sub, takers };
    signalListeners.set(topology.nc, listening);
  }
  const { sub, takers } = listening;
  takers.add(taker);
  return () => {
    takers.delete(taker);
    if (takers.size > 0 || signalListeners.get(topology.nc)?.sub !== sub) return;
    signalListeners.delete(topology.nc);
    sub.unsubscribe();
  };
}
