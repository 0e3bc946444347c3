import { BoxcarError, ErrorCode, type Names, names as namesFor, PRIORITIES, type Priority } from "@boxcar/protocol";
import {
  AckPolicy,
  DiscardPolicy,
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
import { type NatsConnection, errors as natsErrors } from "@nats-io/transport-node";
import { JobStore } from "./job-store.js";
import { isNoResponders } from "./nats-errors.js";

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
   * `dead` (see `GivenUpWork` in the dispatcher).
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
   * The most the history streams and the durable intake keep, in bytes, when they are created
   * (an existing stream keeps its own): events (default 1 GiB), agent output logs (512 MiB),
   * dead letters (256 MiB), submissions waiting to be admitted (64 MiB; past it a new one is
   * refused, none dropped). JetStream reserves these up front, so a small server or account
   * needs smaller ones.
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

/** Handles on every stream, bucket and store of one Boxcar system. */
export interface Topology {
  readonly names: Names;
  /**
   * This system's identity: when its work stream was created. Two systems with one prefix (two
   * `boxcar up` on one machine, say) differ in it, so what one labels with it the other leaves alone.
   */
  readonly systemId: string;
  readonly options: ResolvedTopologyOptions;
  readonly nc: NatsConnection;
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
  /** The job records, for reading and watching; every write goes through `jobStore`. */
  readonly jobs: KV;
  /** The one writer of job records: creates and compare-and-swap changes. */
  readonly jobStore: JobStore;
  readonly agents: KV;
  readonly workers: KV;
  readonly idempotency: KV;
  readonly workflows: KV;
  /**
   * Sessions' records, written by the workers that hold them. Made on first use, not when a role
   * starts: a role of this release starts on a system whose credentials predate sessions (their
   * permissions name no such bucket until the account is pushed again), and only sessions wait.
   */
  sessions(): Promise<KV>;
  /** Rate limits' state (docs/flow-control.md#rate-limits), made on first use as the sessions bucket is. */
  limits(): Promise<KV>;
  /** Schedules (docs/flow-control.md#schedules), made on first use as the sessions bucket is. */
  schedules(): Promise<KV>;
  /** Usage per day, agent and user (docs/flow-control.md#usage-and-budgets), made on first use; a day's goes after 400 days. */
  usage(): Promise<KV>;
  /** Snapshots of sessions' workspaces (an Object Store), made on first use as the sessions bucket is. */
  snapshots(): Promise<ObjectStore>;
  readonly artifacts: ObjectStore;
  /** The admin's system policy (`SystemPolicy`, under the key `system`). */
  readonly policy: KV;
  /**
   * Removes every message `key` has in a bucket's stream, its delete marker included (a
   * JetStream purge filtered on the key's subject): for records deleted for good.
   */
  purgeKey(bucket: "jobs" | "workflows", key: string): Promise<void>;
  /**
   * Creates the durable consumers of a pool's work (one per priority) if they do not exist yet.
   * Resolves with their shortest lease (ack wait) in ms: whoever created a consumer chose it, so
   * workers read it here.
   */
  ensurePoolConsumer(pool: string): Promise<number>;
  /**
   * Creates the durable consumer of the jobs to run in `workerId`'s sessions, if it does not exist
   * yet. It delivers without limit (a job waits for its session's lock by being handed back);
   * once the worker is gone, dispatchers settle what it left and remove it. Resolves with its
   * lease (ack wait) in ms.
   */
  ensureWorkerConsumer(workerId: string): Promise<number>;
}

const MiB = 1024 * 1024;
/** How many waiting pulls a pool consumer holds at once: one per idle worker of the pool. */
const MAX_WAITING_PULLS = 4_096;
/** How long the submit and work streams remember a message id: a re-publish within it is dropped. */
export const DUPLICATE_WINDOW_MS = 120_000;
const DAY_NS = 24 * 3_600 * 1e9;
const nanos = (ms: number): number => ms * 1_000_000;

/**
 * Opens (creating where missing) the streams, KV buckets and Object Store of a Boxcar system.
 * Safe to call from many processes at once.
 */
export async function openTopology(nc: NatsConnection, opts: TopologyOptions = {}): Promise<Topology> {
  const names = namesFor(resolveTopologyOptions(opts).prefix); // checks every option before any request
  const jsm = await jetstreamManager(nc);
  const js = retryingPublish(jetstream(nc));
  const existing = await workStreamReplicas(jsm, names);

  // The work stream comes first: it marks the system, and the others follow its replica count.
  const workStream: StreamSpec = {
    name: names.streams.work,
    subjects: [names.subjects.workAll],
    retention: RetentionPolicy.Workqueue,
    max_msg_size: MiB,
    duplicate_window: nanos(DUPLICATE_WINDOW_MS),
  };
  let replicas = opts.replicas ?? existing;
  if (replicas === undefined) {
    // A new system with no replica count given: 3 if the cluster this server is in can place
    // them (3 or more servers with JetStream), else 1. JetStream's answer is the one that counts.
    const placed =
      inJetStreamCluster(nc) &&
      (await createIfPlaceable(jsm, { ...workStream, storage: StorageType.File, num_replicas: 3 }, placementPatienceMs(nc)));
    replicas = placed ? 3 : 1;
  } else if (existing === undefined && replicas > 1 && inJetStreamCluster(nc)) {
    // A new system asked to keep several replicas, on a cluster: wait up to a minute while its
    // servers join its JetStream, rather than refuse at the first try (a single server refuses at once).
    await createIfPlaceable(jsm, { ...workStream, storage: StorageType.File, num_replicas: replicas }, ASKED_PLACEMENT_PATIENCE_MS);
  }
  const options = resolveTopologyOptions({ ...opts, replicas });
  const num_replicas = options.replicas;

  const streams: StreamSpec[] = [
    workStream,
    {
      name: names.streams.submit,
      subjects: [names.subjects.submitAll],
      retention: RetentionPolicy.Workqueue,
      // A flood of durable submissions is refused at its limit instead of taking the whole store.
      max_bytes: options.streamLimits.submit,
      discard: DiscardPolicy.New,
      max_msg_size: MiB,
      duplicate_window: nanos(DUPLICATE_WINDOW_MS),
    },
    {
      name: names.streams.events,
      subjects: [names.subjects.eventsAll],
      retention: RetentionPolicy.Limits,
      max_age: 7 * DAY_NS,
      max_bytes: options.streamLimits.events,
    },
    {
      name: names.streams.dead,
      subjects: [names.subjects.deadAll],
      retention: RetentionPolicy.Limits,
      max_age: 30 * DAY_NS,
      max_bytes: options.streamLimits.dead,
    },
    {
      name: names.streams.logs,
      subjects: [names.subjects.logsAll],
      retention: RetentionPolicy.Limits,
      max_age: 7 * DAY_NS,
      max_bytes: options.streamLimits.logs,
      max_msg_size: MiB,
    },
  ];
  const kvm = new Kvm(js);
  // With several replicas a direct get may be answered by a follower that has not applied the
  // latest write yet (a worker would find no record for a job just admitted): read from the leader.
  const consistentReads = num_replicas > 1 ? { allow_direct: false } : {};
  const kv = (name: string, extra: { history?: number; ttl?: number; max_bytes?: number } = {}) =>
    kvm.create(name, {
      replicas: num_replicas,
      history: extra.history ?? 1,
      ...(extra.ttl ? { ttl: extra.ttl } : {}),
      ...(extra.max_bytes ? { max_bytes: extra.max_bytes } : {}),
      ...consistentReads,
    });
  let jobs: KV, agents: KV, workers: KV, idempotency: KV, workflows: KV, policy: KV, artifacts: ObjectStore;
  try {
    for (const config of streams) {
      await ensureStream(jsm, { storage: StorageType.File, num_replicas, ...config });
    }
    [jobs, agents, workers, idempotency, workflows, policy] = await Promise.all([
      // A job or run record is kept once, its latest revision: each revision carries the whole
      // record, input included (a bucket made before keeps the 5 it was made with).
      kv(names.buckets.jobs),
      kv(names.buckets.agents, { history: 5 }),
      kv(names.buckets.workers, { ttl: options.workerTtlMs }),
      kv(names.buckets.idempotency, { ttl: options.idempotencyWindowMs }),
      kv(names.buckets.workflows),
      kv(names.buckets.policy, { history: 5 }),
    ]);
    artifacts = await new Objm(js).create(names.buckets.artifacts, { replicas: num_replicas });
  } catch (err) {
    throw storageError(err, options.streamLimits) ?? replicaError(err, num_replicas);
  }

  const systemId = (await jsm.streams.info(names.streams.work)).created;

  let snapshots: Promise<ObjectStore> | undefined;
  /** A bucket made on first use; one its credentials cannot open names the fix. */
  const onFirstUse = <T>(what: string, open: () => Promise<T>, forget: () => void): Promise<T> =>
    open().catch((err: unknown) => {
      forget();
      throw new BoxcarError(
        ErrorCode.unavailable,
        `the ${what} cannot be opened (${(err as Error).message}): on a system whose credentials predate it, push the account again (boxcar auth push)`,
      );
    });
  /** A KV bucket made on first use (and asked again after a failure). */
  const kvOnFirstUse = (what: string, bucket: string, bounds: { ttl?: number; max_bytes?: number } = {}) => {
    let opened: Promise<KV> | undefined;
    return () => {
      opened ??= onFirstUse(
        what,
        () => kv(bucket, bounds),
        () => {
          opened = undefined;
        },
      );
      return opened;
    };
  };
  const leases = new Map<string, number>();
  const purgeKey = async (bucket: "jobs" | "workflows", key: string) => {
    const name = names.buckets[bucket];
    await jsm.streams.purge(`KV_${name}`, { filter: `$KV.${name}.${key}` });
  };
  return {
    names,
    systemId,
    options,
    nc,
    js,
    jsm,
    jobs,
    jobStore: new JobStore(jobs, (id) => purgeKey("jobs", id)),
    agents,
    workers,
    idempotency,
    workflows,
    sessions: kvOnFirstUse("sessions bucket", names.buckets.sessions),
    // A limit's state last written 31 days ago is in the past (a turn is reserved at most 30 days
    // ahead, a period is at most a day): it goes, so that one key per customer does not pile up;
    // and the bucket is bounded, so that keys minted faster than that cannot fill the disk.
    limits: kvOnFirstUse("limits bucket", names.buckets.limits, { ttl: 31 * 24 * 3_600_000, max_bytes: 256 * 1024 * 1024 }),
    schedules: kvOnFirstUse("schedules bucket", names.buckets.schedules, { max_bytes: 256 * 1024 * 1024 }),
    usage: kvOnFirstUse("usage bucket", names.buckets.usage, { ttl: 400 * 24 * 3_600_000, max_bytes: 256 * 1024 * 1024 }),
    snapshots: () => {
      snapshots ??= onFirstUse(
        "snapshots store",
        () => new Objm(js).create(names.buckets.snapshots, { replicas: num_replicas }),
        () => {
          snapshots = undefined;
        },
      );
      return snapshots;
    },
    artifacts,
    policy,
    purgeKey,
    async ensureWorkerConsumer(workerId) {
      const durable = names.workerConsumer(workerId);
      const info = await jsm.consumers.info(names.streams.work, durable).catch(async (err: unknown) => {
        if (!isNotFound(err)) throw err;
        return jsm.consumers.add(names.streams.work, {
          durable_name: durable,
          filter_subject: names.subjects.sessionWork(workerId),
          ack_policy: AckPolicy.Explicit,
          ack_wait: nanos(options.ackWaitMs),
          max_ack_pending: 10_000,
        });
      });
      return Math.round((info.config.ack_wait ?? nanos(options.ackWaitMs)) / 1_000_000);
    },
    async ensurePoolConsumer(pool) {
      let leaseMs = leases.get(pool);
      if (leaseMs === undefined) {
        const ackWaits = await Promise.all(PRIORITIES.map((priority) => ensureWorkConsumer(pool, priority)));
        leaseMs = Math.round(Math.min(...ackWaits) / 1_000_000);
        leases.set(pool, leaseMs);
      }
      return leaseMs;
    },
  };

  /** Resolves with the consumer's ack wait in ns. */
  async function ensureWorkConsumer(pool: string, priority: Priority): Promise<number> {
    const durable = names.poolConsumer(pool, priority);
    try {
      return (await jsm.consumers.info(names.streams.work, durable)).config.ack_wait ?? nanos(options.ackWaitMs);
    } catch (err) {
      if (!isNotFound(err)) throw err;
      const info = await jsm.consumers.add(names.streams.work, {
        durable_name: durable,
        filter_subject: names.subjects.work(pool, priority),
        ack_policy: AckPolicy.Explicit,
        ack_wait: nanos(options.ackWaitMs),
        max_deliver: options.maxDeliveries,
        max_ack_pending: 10_000,
        // Every idle worker of the pool keeps one waiting pull here (JetStream's default allows 512).
        max_waiting: MAX_WAITING_PULLS,
      });
      return info.config.ack_wait ?? nanos(options.ackWaitMs);
    }
  }
}

type StreamSpec = Partial<StreamConfig> & { name: string };

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
function retryingPublish(js: JetStreamClient): JetStreamClient {
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

/** The replica count of the system's work stream; undefined when the system does not exist. */
async function workStreamReplicas(jsm: JetStreamManager, names: Names): Promise<number | undefined> {
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
function inJetStreamCluster(nc: NatsConnection): boolean {
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
function placementPatienceMs(nc: NatsConnection): number {
  return (nc.info?.connect_urls?.length ?? 0) >= 3 ? ASKED_PLACEMENT_PATIENCE_MS : 5_000;
}

/** How long a replica count that was asked for (`--replicas`) is tried before it is refused. */
const ASKED_PLACEMENT_PATIENCE_MS = 60_000;

/**
 * Creates the stream (or finds it made by another process); false when JetStream keeps refusing
 * its replica count for `patienceMs`.
 */
async function createIfPlaceable(jsm: JetStreamManager, config: StreamSpec, patienceMs: number): Promise<boolean> {
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

/** JetStream's answer when the storage a stream or bucket asks for is more than the server or account has free. */
const INSUFFICIENT_STORAGE = 10047;

/** A refusal for want of storage, said in one line with what Boxcar asked for and how to ask for less; undefined for other errors. */
function storageError(err: unknown, limits: Required<StreamLimits>): BoxcarError | undefined {
  if (!(err instanceof JetStreamApiError && err.code === INSUFFICIENT_STORAGE)) return undefined;
  const size = (bytes: number) => (bytes % 1024 ** 3 === 0 ? `${bytes / 1024 ** 3}Gi` : `${Math.round(bytes / 1024 ** 2)}Mi`);
  const asked = Object.entries(limits)
    .map(([stream, bytes]) => `${stream}=${size(bytes)}`)
    .join(",");
  const total = Object.values(limits).reduce((a, b) => a + b, 0);
  return new BoxcarError(
    ErrorCode.storageFull,
    `JetStream has less file storage free than Boxcar's streams reserve (${asked}, ${size(total)} in all, plus room for jobs): ` +
      "give the server or account more (jetstream max_file_store, account limits) or reserve less with --stream-limits / BOXCAR_STREAM_LIMITS, e.g. events=64Mi,logs=32Mi,dead=16Mi,submit=8Mi",
    { cause: err },
  );
}

function replicaError(err: unknown, replicas: number): unknown {
  if (!isReplicaRefusal(err)) return err;
  return new BoxcarError(
    ErrorCode.unavailable,
    `JetStream cannot keep ${replicas} replicas here (${err.message}): it needs as many servers with JetStream up in one cluster; use --replicas / BOXCAR_REPLICAS 1 on a single server`,
    { cause: err },
  );
}

async function ensureStream(jsm: JetStreamManager, config: StreamSpec): Promise<void> {
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
