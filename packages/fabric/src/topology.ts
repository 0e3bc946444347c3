/**
 * A Boxcar system's topology: the handles on its streams, KV buckets and Object Stores
 * (`Topology`), opened (created where missing) by `openTopology`, which decides the replica
 * count of a new system, makes the buckets used only by some features on first use, and creates
 * the pools' and workers' durable consumers of work. Its options are in topology-options.ts,
 * where JetStream places the streams in stream-placement.ts, how much storage they reserve (and
 * what a start refused for want of it says) in stream-sizing.ts, publishing that rides out a
 * restart in publish-retry.ts.
 */

import { BoxcarError, ErrorCode, type Names, names as namesFor, PRIORITIES, type Priority, type Usage } from "@boxcar/protocol";
import { NO_USAGE, parseUsageEntry, usageKey } from "@boxcar/protocol/internal";
import {
  AckPolicy,
  DiscardPolicy,
  type JetStreamClient,
  type JetStreamManager,
  jetstream,
  jetstreamManager,
  RetentionPolicy,
  StorageType,
} from "@nats-io/jetstream";
import { type KV, Kvm } from "@nats-io/kv";
import { type ObjectStore, Objm } from "@nats-io/obj";
import { headers, type NatsConnection } from "@nats-io/transport-node";
import { publishEvent } from "./events.js";
import { JobStore } from "./job-store.js";
import { isNotFound } from "./nats-errors.js";
import { retryingPublish } from "./publish-retry.js";
import { removeMessage } from "./remove-message.js";
import {
  ASKED_PLACEMENT_PATIENCE_MS,
  createIfPlaceable,
  ensureStream,
  inJetStreamCluster,
  placementPatienceMs,
  replicaError,
  type StreamSpec,
  workStreamReplicas,
} from "./stream-placement.js";
import {
  bucketReservation,
  isStorageRefusal,
  type LimitedStream,
  prepareLimitedStreams,
  removeStreams,
  type StorageShortfall,
  storageShortfallError,
} from "./stream-sizing.js";
import { type ResolvedTopologyOptions, resolveTopologyOptions, type StreamLimits, type TopologyOptions } from "./topology-options.js";

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
  /** The model gateways' count of calls per model limit and window (docs/models.md#limits), made on first use. */
  modelUse(): Promise<KV>;
  /** Schedules (docs/flow-control.md#schedules), made on first use as the sessions bucket is. */
  schedules(): Promise<KV>;
  /** Usage per day, agent and user (docs/flow-control.md#usage-and-budgets), made on first use; a day's goes after 400 days. */
  usage(): Promise<KV>;
  /**
   * A day's usage of one agent or user as the dispatchers summed it, read without making the
   * bucket (a worker may read it, not make it): nothing when there is none, or no bucket yet.
   */
  usageOf(day: string, kind: "agent" | "user", name: string): Promise<Usage>;
  /** Snapshots of sessions' workspaces (an Object Store), made on first use as the sessions bucket is. */
  snapshots(): Promise<ObjectStore>;
  /** The job index's snapshots (an Object Store), made on first use: the dispatchers' alone. */
  jobIndex(): Promise<ObjectStore>;
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

  // The streams JetStream reserves storage for. Before any of them is made, those that exist are
  // shrunk to the sizes given and the missing ones checked to fit (stream-sizing.ts), so a start
  // refused for want of storage leaves nothing behind (the work stream it made, which reserves
  // nothing, is removed too, where its credentials may).
  const limited: Record<LimitedStream, StreamSpec> = {
    events: {
      name: names.streams.events,
      subjects: [names.subjects.eventsAll],
      retention: RetentionPolicy.Limits,
      max_age: 7 * DAY_NS,
      max_bytes: options.streamLimits.events,
    },
    logs: {
      name: names.streams.logs,
      subjects: [names.subjects.logsAll],
      retention: RetentionPolicy.Limits,
      max_age: 7 * DAY_NS,
      max_bytes: options.streamLimits.logs,
      max_msg_size: MiB,
    },
    dead: {
      name: names.streams.dead,
      subjects: [names.subjects.deadAll],
      retention: RetentionPolicy.Limits,
      max_age: 30 * DAY_NS,
      max_bytes: options.streamLimits.dead,
    },
    submit: {
      name: names.streams.submit,
      subjects: [names.subjects.submitAll],
      retention: RetentionPolicy.Workqueue,
      // A flood of durable submissions is refused at its limit instead of taking the whole store.
      max_bytes: options.streamLimits.submit,
      discard: DiscardPolicy.New,
      max_msg_size: MiB,
      duplicate_window: nanos(DUPLICATE_WINDOW_MS),
    },
  };
  /** A subject of the work stream, to ask a single server what it has free (stream-sizing.ts); not on a cluster. */
  const overlapping = inJetStreamCluster(nc) ? undefined : names.subjects.workAll;
  /** The streams this start made, removed again if it is refused for want of storage. */
  const made: string[] = [];
  let missing: StreamLimits = {};
  const refusal = async (shortfall: Omit<StorageShortfall, "removed" | "leftBehind">, cause?: unknown) =>
    storageShortfallError({ ...shortfall, ...(await removeStreams(jsm, made)) }, cause);
  try {
    await ensureStream(jsm, { storage: StorageType.File, num_replicas, ...workStream });
    // Not there when this start began: made by it (here, or above while choosing the replicas).
    if (existing === undefined) made.push(workStream.name);
    const prepared = await prepareLimitedStreams(jsm, { specs: limited, given: opts.streamLimits ?? {}, overlapping });
    missing = prepared.missing;
    if (prepared.shortfall) throw await refusal(prepared.shortfall);
    for (const config of Object.values(limited)) {
      if (await ensureStream(jsm, { storage: StorageType.File, num_replicas, ...config })) made.push(config.name);
    }
  } catch (err) {
    if (!isStorageRefusal(err)) throw replicaError(err, num_replicas);
    // JetStream refused what it was asked to reserve after all: where free space could not be
    // measured beforehand (a cluster), or taken meanwhile by another system's streams.
    throw await refusal({ asked: missing, reservedBy: [], notShrunk: [] }, err);
  }
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
    throw replicaError(err, num_replicas);
  }

  const systemId = (await jsm.streams.info(names.streams.work)).created;

  let usageView: Promise<KV> | undefined;
  /** A bucket made on first use; one its credentials cannot open names the fix. */
  const onFirstUse = <T>(what: string, open: () => Promise<T>, forget: () => void): Promise<T> =>
    open().catch((err: unknown) => {
      forget();
      if (err instanceof BoxcarError && err.code === ErrorCode.storageFull) throw err;
      if (isStorageRefusal(err)) throw new BoxcarError(ErrorCode.storageFull, `the ${what} cannot be made: ${err.message}`, { cause: err });
      throw new BoxcarError(
        ErrorCode.unavailable,
        `the ${what} cannot be opened (${(err as Error).message}): on a system whose credentials predate it, push the account again (boxcar auth push)`,
      );
    });
  /**
   * A bucket's bounds with its size cut to what a small server has free, when it is still to be
   * made (one that exists keeps its own): asking a size that does not fit would be refused.
   */
  const sized = async <B extends { max_bytes?: number }>(bucket: string, bounds: B): Promise<B> => {
    if (!bounds.max_bytes) return bounds;
    const exists = await jsm.streams.info(`KV_${bucket}`).then(
      () => true,
      (err: unknown) => {
        if (isNotFound(err)) return false;
        throw err;
      },
    );
    return exists ? bounds : { ...bounds, max_bytes: await bucketReservation(jsm, `KV_${bucket}`, bounds.max_bytes, overlapping) };
  };
  /** A KV bucket made on first use (and asked again after a failure). */
  const kvOnFirstUse = (what: string, bucket: string, bounds: { ttl?: number; max_bytes?: number } = {}) => {
    let opened: Promise<KV> | undefined;
    return () => {
      opened ??= onFirstUse(
        what,
        async () => kv(bucket, await sized(bucket, bounds)),
        () => {
          opened = undefined;
        },
      );
      return opened;
    };
  };
  /** An Object Store made on first use (and asked again after a failure). */
  const objOnFirstUse = (what: string, bucket: string) => {
    let opened: Promise<ObjectStore> | undefined;
    return () => {
      opened ??= onFirstUse(
        what,
        () => new Objm(js).create(bucket, { replicas: num_replicas }),
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
    jobStore: new JobStore(
      jobs,
      {
        removeRevision: (id, revision) => removeMessage(jsm, `KV_${names.buckets.jobs}`, `$KV.${names.buckets.jobs}.${id}`, revision),
        async markDeleted(id) {
          const marker = headers();
          marker.set("KV-Operation", "DEL");
          await js.publish(`$KV.${names.buckets.jobs}.${id}`, new Uint8Array(0), { headers: marker, expect: { lastSubjectSequence: 0 } });
        },
      },
      (event) => publishEvent({ names, js }, event),
    ),
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
    async usageOf(day, kind, name) {
      usageView ??= new Kvm(js).open(names.buckets.usage);
      const entry = await (await usageView).get(usageKey(day, kind, name)).catch((err: unknown) => {
        if (isNotFound(err)) return null; // no usage summed yet
        throw err;
      });
      return (entry?.operation === "PUT" ? parseUsageEntry(entry.string()) : undefined)?.usage ?? NO_USAGE;
    },
    // A window's count is of no use once the window is over (a window is at most a day).
    modelUse: kvOnFirstUse("model use bucket", names.buckets.modelUse, { ttl: 2 * 24 * 3_600_000, max_bytes: 64 * 1024 * 1024 }),
    snapshots: objOnFirstUse("snapshots store", names.buckets.snapshots),
    jobIndex: objOnFirstUse("job index store", names.buckets.jobIndex),
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
