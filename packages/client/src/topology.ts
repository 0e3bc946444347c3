import { BoxcarError, ErrorCode, type Names, names as namesFor } from "@boxcar/protocol";
import {
  AckPolicy,
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
  RetentionPolicy,
  StorageType,
  type StreamConfig,
} from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import { type ObjectStore, Objm } from "@nats-io/obj";
import type { NatsConnection } from "@nats-io/transport-node";

export interface TopologyOptions {
  /** Subject and bucket prefix; default `boxcar`. */
  prefix?: string;
  /** Replicas of every stream, bucket and object store; default 1 (use 3 on a cluster). */
  replicas?: number;
  /** How long a worker may stay silent on a job before JetStream redelivers it; default 30 s. */
  ackWaitMs?: number;
  /** How long an idempotency key is remembered; default 24 h. */
  idempotencyWindowMs?: number;
  /**
   * How long a worker's presence entry is kept after its last write; default 1 h. A worker that
   * misses 3 heartbeats is gone long before (`workerStatus`); the entry stays so `boxcar workers`
   * can show it and account for the jobs it had in hand.
   */
  workerTtlMs?: number;
  /**
   * Create the streams and buckets where missing (default). Clients pass `false`: a system that
   * does not exist (say, a mistyped prefix) is then an error rather than a new empty system.
   */
  create?: boolean;
}

export interface ResolvedTopologyOptions {
  prefix: string;
  replicas: number;
  ackWaitMs: number;
  idempotencyWindowMs: number;
  workerTtlMs: number;
}

export function resolveTopologyOptions(opts: TopologyOptions = {}): ResolvedTopologyOptions {
  const resolved = {
    prefix: opts.prefix ?? "boxcar",
    replicas: opts.replicas ?? 1,
    ackWaitMs: opts.ackWaitMs ?? 30_000,
    idempotencyWindowMs: opts.idempotencyWindowMs ?? 24 * 3_600_000,
    workerTtlMs: opts.workerTtlMs ?? 3_600_000,
  };
  if (![1, 3, 5].includes(resolved.replicas)) throw new RangeError(`replicas must be 1, 3 or 5, got ${resolved.replicas}`);
  if (resolved.ackWaitMs < 1_000) throw new RangeError(`ackWaitMs must be at least 1000, got ${resolved.ackWaitMs}`);
  return resolved;
}

/** Handles on every stream, bucket and store of one Boxcar system. */
export interface Topology {
  readonly names: Names;
  readonly options: ResolvedTopologyOptions;
  readonly nc: NatsConnection;
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  readonly jobs: KV;
  readonly agents: KV;
  readonly workers: KV;
  readonly idempotency: KV;
  readonly workflows: KV;
  readonly artifacts: ObjectStore;
  /**
   * Creates the durable consumer of a pool's work if it does not exist yet. Resolves with its
   * lease (ack wait) in ms: whoever created the consumer chose it, so workers read it here.
   */
  ensurePoolConsumer(pool: string): Promise<number>;
}

const MiB = 1024 * 1024;
/** How long the submit and work streams remember a message id: a re-publish within it is dropped. */
export const DUPLICATE_WINDOW_MS = 120_000;
const DAY_NS = 24 * 3_600 * 1e9;
const nanos = (ms: number): number => ms * 1_000_000;

/**
 * Opens (creating where missing) the streams, KV buckets and Object Store of a Boxcar system.
 * Safe to call from many processes at once.
 */
export async function openTopology(nc: NatsConnection, opts: TopologyOptions = {}): Promise<Topology> {
  const options = resolveTopologyOptions(opts);
  const names = namesFor(options.prefix);
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  if (opts.create === false) await requireSystem(jsm, names);
  const num_replicas = options.replicas;

  const streams: (Partial<StreamConfig> & { name: string })[] = [
    {
      name: names.streams.submit,
      subjects: [names.subjects.submitAll],
      retention: RetentionPolicy.Workqueue,
      max_msg_size: MiB,
      duplicate_window: nanos(DUPLICATE_WINDOW_MS),
    },
    {
      name: names.streams.work,
      subjects: [names.subjects.workAll],
      retention: RetentionPolicy.Workqueue,
      max_msg_size: MiB,
      duplicate_window: nanos(DUPLICATE_WINDOW_MS),
    },
    {
      name: names.streams.events,
      subjects: [names.subjects.eventsAll],
      retention: RetentionPolicy.Limits,
      max_age: 7 * DAY_NS,
      max_bytes: 1024 * MiB,
    },
    {
      name: names.streams.dead,
      subjects: [names.subjects.deadAll],
      retention: RetentionPolicy.Limits,
      max_age: 30 * DAY_NS,
      max_bytes: 256 * MiB,
    },
    {
      name: names.streams.logs,
      subjects: [names.subjects.logsAll],
      retention: RetentionPolicy.Limits,
      max_age: 7 * DAY_NS,
      max_bytes: 512 * MiB,
      max_msg_size: MiB,
    },
  ];
  for (const config of streams) {
    await ensureStream(jsm, { storage: StorageType.File, num_replicas, ...config });
  }

  const kvm = new Kvm(js);
  const kv = (name: string, extra: { history?: number; ttl?: number } = {}) =>
    kvm.create(name, { replicas: num_replicas, history: extra.history ?? 1, ...(extra.ttl ? { ttl: extra.ttl } : {}) });
  const [jobs, agents, workers, idempotency, workflows] = await Promise.all([
    kv(names.buckets.jobs, { history: 5 }),
    kv(names.buckets.agents, { history: 5 }),
    kv(names.buckets.workers, { ttl: options.workerTtlMs }),
    kv(names.buckets.idempotency, { ttl: options.idempotencyWindowMs }),
    kv(names.buckets.workflows, { history: 5 }),
  ]);
  const artifacts = await new Objm(js).create(names.buckets.artifacts, { replicas: num_replicas });

  const leases = new Map<string, number>();
  return {
    names,
    options,
    nc,
    js,
    jsm,
    jobs,
    agents,
    workers,
    idempotency,
    workflows,
    artifacts,
    async ensurePoolConsumer(pool) {
      const known = leases.get(pool);
      if (known !== undefined) return known;
      const durable = names.poolConsumer(pool);
      let ackWaitNs: number;
      try {
        ackWaitNs = (await jsm.consumers.info(names.streams.work, durable)).config.ack_wait ?? nanos(options.ackWaitMs);
      } catch (err) {
        if (!isNotFound(err)) throw err;
        const info = await jsm.consumers.add(names.streams.work, {
          durable_name: durable,
          filter_subject: names.subjects.work(pool),
          ack_policy: AckPolicy.Explicit,
          ack_wait: nanos(options.ackWaitMs),
          max_ack_pending: 10_000,
        });
        ackWaitNs = info.config.ack_wait ?? nanos(options.ackWaitMs);
      }
      const leaseMs = Math.round(ackWaitNs / 1_000_000);
      leases.set(pool, leaseMs);
      return leaseMs;
    },
  };
}

async function requireSystem(jsm: JetStreamManager, names: Names): Promise<void> {
  try {
    await jsm.streams.info(names.streams.work);
  } catch (err) {
    if (!isNotFound(err)) throw err;
    throw new BoxcarError(
      ErrorCode.unavailable,
      `no Boxcar system with prefix ${JSON.stringify(names.prefix)} on this NATS: start a dispatcher (or \`boxcar up\`), or check --prefix`,
    );
  }
}

async function ensureStream(jsm: JetStreamManager, config: Partial<StreamConfig> & { name: string }): Promise<void> {
  try {
    await jsm.streams.info(config.name);
  } catch (err) {
    if (!isNotFound(err)) throw err;
    try {
      await jsm.streams.add(config);
    } catch (addErr) {
      // Another process created it between our info and add.
      if (!(addErr instanceof JetStreamApiError && addErr.code === 10058)) throw addErr;
    }
  }
}

export function isNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && (err.status === 404 || err.code === 10014 || err.code === 10059);
}
