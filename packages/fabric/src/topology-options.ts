/**
 * The options of a Boxcar system's topology: the prefix, replicas, leases, how long keys are
 * remembered and how much the streams reserve; their defaults and the ranges they are checked
 * against (`resolveTopologyOptions`). `openTopology` (topology.ts) opens a system with them.
 */

export interface TopologyOptions {
  /** Subject and bucket prefix; default `boxcar`. */
  prefix?: string;
  /**
   * Replicas of every stream, bucket and object store: 1, 3 or 5. Default: what the existing
   * system uses (its work stream's replicas); for a new system, 3 when the server this
   * connection is on is in a cluster of at least 3 servers with JetStream, else 1.
   */
  replicas?: number;
  /** How long a worker may stay silent on a job before JetStream redelivers it; default 30 s. */
  ackWaitMs?: number;
  /**
   * How many times JetStream delivers a work item before it gives up on it (`max_deliver` of
   * each pool consumer, when the consumer is created); default 20. Dispatchers then end the job
   * `dead` (see `GivenUpSweep` in the dispatcher).
   */
  maxDeliveries?: number;
  /** How long an idempotency key is remembered; default 24 h. */
  idempotencyWindowMs?: number;
  /**
   * How long a worker's presence entry is kept after its last write; default 1 h. A worker that
   * misses 3 heartbeats is gone long before (`workerStatus`); the entry stays so `boxcar workers`
   * can show it and account for the jobs it had in hand.
   */
  workerTtlMs?: number;
  /**
   * The most the history streams and the durable intake keep, in bytes: events (default 1 GiB),
   * agent output logs (512 MiB), dead letters (256 MiB), submissions waiting to be admitted
   * (64 MiB; past it a new one is refused, none dropped). JetStream reserves these up front, so a
   * small server or account needs smaller ones: a start whose missing streams do not fit in what
   * JetStream has free is refused before it makes any, with sizes that would fit. A stream that
   * exists keeps its size unless a smaller one is given here: then it is shrunk to it (never
   * below what it holds, so nothing is dropped).
   */
  streamLimits?: StreamLimits;
}

/** Sizes of the streams JetStream reserves storage for, in bytes. */
export interface StreamLimits {
  events?: number;
  logs?: number;
  dead?: number;
  submit?: number;
}

/** What each limited stream reserves by default. */
export const DEFAULT_STREAM_LIMITS: Required<StreamLimits> = {
  events: 1024 * 1024 ** 2,
  logs: 512 * 1024 ** 2,
  dead: 256 * 1024 ** 2,
  submit: 64 * 1024 ** 2,
};

export interface ResolvedTopologyOptions {
  prefix: string;
  replicas: number;
  ackWaitMs: number;
  maxDeliveries: number;
  idempotencyWindowMs: number;
  workerTtlMs: number;
  streamLimits: Required<StreamLimits>;
}

/**
 * Fills defaults and checks ranges. Without `replicas` it uses `defaultReplicas` (1): only
 * `openTopology` can look at the NATS system to choose.
 */
export function resolveTopologyOptions(opts: TopologyOptions = {}, defaultReplicas = 1): ResolvedTopologyOptions {
  const resolved = {
    prefix: opts.prefix ?? "boxcar",
    replicas: opts.replicas ?? defaultReplicas,
    ackWaitMs: opts.ackWaitMs ?? 30_000,
    maxDeliveries: opts.maxDeliveries ?? 20,
    idempotencyWindowMs: opts.idempotencyWindowMs ?? 24 * 3_600_000,
    workerTtlMs: opts.workerTtlMs ?? 3_600_000,
    streamLimits: { ...DEFAULT_STREAM_LIMITS, ...opts.streamLimits },
  };
  for (const [stream, bytes] of Object.entries(resolved.streamLimits)) {
    if (!Number.isInteger(bytes) || bytes < 1024 ** 2)
      throw new RangeError(`the ${stream} stream's limit must be at least 1 MiB, got ${bytes} bytes`);
  }
  if (![1, 3, 5].includes(resolved.replicas)) throw new RangeError(`replicas must be 1, 3 or 5, got ${resolved.replicas}`);
  if (resolved.ackWaitMs < 1_000) throw new RangeError(`ackWaitMs must be at least 1000, got ${resolved.ackWaitMs}`);
  if (!Number.isInteger(resolved.maxDeliveries) || resolved.maxDeliveries < 1) {
    throw new RangeError(`maxDeliveries must be a whole number of at least 1, got ${resolved.maxDeliveries}`);
  }
  return resolved;
}
