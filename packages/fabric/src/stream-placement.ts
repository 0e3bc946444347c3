/**
 * Where JetStream puts the system's streams: creating a stream (or finding it made by another
 * process), the replica count an existing system has, whether this server is in a JetStream
 * cluster and how long a refused replica count is tried again, and a refused replica count said
 * in one line with how to ask for less (a refusal for want of storage is stream-sizing.ts's).
 * `openTopology` (topology.ts) decides with these.
 */

import { BoxcarError, ErrorCode, type Names } from "@boxcar/protocol";
import { JetStreamApiError, type JetStreamManager, type StreamConfig } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { isNotFound } from "./nats-errors.js";

/** A stream's configuration as Boxcar asks for it: its name and what it sets. */
export type StreamSpec = Partial<StreamConfig> & { name: string };

/** The replica count of the system's work stream; undefined when the system does not exist. */
export async function workStreamReplicas(jsm: JetStreamManager, names: Names): Promise<number | undefined> {
  try {
    return (await jsm.streams.info(names.streams.work)).config.num_replicas || 1;
  } catch (err) {
    if (!isNotFound(err)) throw err;
    return undefined;
  }
}

/**
 * Whether the server this connection is on is part of a cluster (its INFO names one) and has
 * JetStream. How many servers of that cluster have JetStream is JetStream's to say: creating a
 * stream with 3 replicas succeeds only when it can place them. (The client's INFO lists the
 * cluster's servers too, but only those whose routes are up yet.)
 */
export function inJetStreamCluster(nc: NatsConnection): boolean {
  return Boolean(nc.info?.cluster && nc.info.jetstream);
}

/** JetStream's refusals of a replica count this NATS system cannot hold. */
const REPLICA_REFUSALS: readonly number[] = [
  10005, // no suitable peers for placement
  10023, // insufficient resources
  10074, // replicas > 1 not supported in non-clustered mode
];

const isReplicaRefusal = (err: unknown): err is JetStreamApiError =>
  err instanceof JetStreamApiError && REPLICA_REFUSALS.includes(err.code);

/**
 * How long a refused replica count is tried again: the servers of a cluster that has just
 * started join its JetStream one by one. 5 s, or 60 s when the server advertises 3 or more
 * client URLs for its cluster (`connect_urls`; a server with several addresses counts each): a
 * busy machine has been seen to take longer than 5 s to bring the third in, and a new system
 * there must not settle for 1 replica (a Compose cluster did, in CI, and lost its streams with
 * the server they were on).
 */
export function placementPatienceMs(nc: NatsConnection): number {
  return (nc.info?.connect_urls?.length ?? 0) >= 3 ? ASKED_PLACEMENT_PATIENCE_MS : 5_000;
}

/** How long a replica count that was asked for (`--replicas`) is tried before it is refused. */
export const ASKED_PLACEMENT_PATIENCE_MS = 60_000;

/**
 * Creates the stream (or finds it made by another process); false when JetStream keeps refusing
 * its replica count for `patienceMs`.
 */
export async function createIfPlaceable(jsm: JetStreamManager, config: StreamSpec, patienceMs: number): Promise<boolean> {
  const deadline = Date.now() + patienceMs;
  for (;;) {
    try {
      await ensureStream(jsm, config);
      return true;
    } catch (err) {
      if (!isReplicaRefusal(err)) throw err;
      if (Date.now() + 500 > deadline) return false;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

export function replicaError(err: unknown, replicas: number): unknown {
  if (!isReplicaRefusal(err)) return err;
  return new BoxcarError(
    ErrorCode.unavailable,
    `JetStream cannot keep ${replicas} replicas here (${err.message}): it needs as many servers with JetStream up in one cluster; use --replicas / BOXCAR_REPLICAS 1 on a single server`,
    { cause: err },
  );
}

/** Creates the stream unless it exists; true when this call made it. */
export async function ensureStream(jsm: JetStreamManager, config: StreamSpec): Promise<boolean> {
  try {
    await jsm.streams.info(config.name);
    return false;
  } catch (err) {
    if (!isNotFound(err)) throw err;
    try {
      await jsm.streams.add(config);
      return true;
    } catch (addErr) {
      // Another process created it between our info and add.
      if (!(addErr instanceof JetStreamApiError && addErr.code === 10058)) throw addErr;
      return false;
    }
  }
}
