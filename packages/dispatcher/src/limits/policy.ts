import { jsonOf, type Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { followKv, listJson } from "@boxcar/fabric/internal";
import {
  AgentDefinition,
  API_CONTRACT,
  ApiEndpoint,
  BoxcarError,
  ErrorCode,
  type ErrorIssue,
  type Identity,
  type JobRecord,
  parseWith,
  SystemPolicy,
} from "@boxcar/protocol";
import { DEFAULT_QUEUE_LIMITS, POLICY_KEY, policyViolations, quotaOf } from "@boxcar/protocol/internal";
import type { KvEntry } from "@nats-io/kv";
import type { IndexedJob, JobIndex } from "../jobs/job-index.js";
import { StoreRoom } from "./store-room.js";

/**
 * The admin's system policy as this dispatcher knows it: read at start, then kept current by a
 * watch, so checking it adds no request to a submission.
 */
export class PolicyBook {
  private current: SystemPolicy = SystemPolicy.parse({});
  private stopWatch: () => void = () => {};

  constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
  ) {}

  /** A book, started. */
  static async open(topology: Topology, log: Logger): Promise<PolicyBook> {
    const book = new PolicyBook(topology, log);
    await book.start();
    return book;
  }

  /** Reads the stored policy, then follows it. */
  async start(): Promise<void> {
    const stored = await this.topology.policy.get(POLICY_KEY);
    if (stored) this.take(stored);
    // The watch delivers the stored value again (or a newer one), then every change.
    this.stopWatch = await followKv(this.topology.policy, (entry) => this.take(entry), { key: POLICY_KEY });
  }

  get policy(): SystemPolicy {
    return this.current;
  }

  private take(entry: KvEntry): void {
    if (entry.operation !== "PUT") {
      this.current = SystemPolicy.parse({});
      return;
    }
    const parsed = SystemPolicy.safeParse(jsonOf(entry));
    if (parsed.success) this.current = parsed.data;
    else this.log.error({ revision: entry.revision }, "the stored system policy does not parse; keeping the one before");
  }

  /** Stores a new policy and says which applied agents it would refuse (they stay, but cannot be submitted to). */
  async set(body: unknown): Promise<{ policy: SystemPolicy; refusedAgents: { name: string; issues: ErrorIssue[] }[] }> {
    const { policy } = parseWith(API_CONTRACT[ApiEndpoint.policySet].request, body, "request");
    await this.topology.policy.put(POLICY_KEY, JSON.stringify(policy));
    this.current = policy;
    const agents = await listJson(this.topology.agents, AgentDefinition, "agent");
    const refusedAgents = agents
      .map((agent) => ({ name: agent.name, issues: policyViolations(agent, policy.agents) }))
      .filter((a) => a.issues.length > 0);
    this.log.info({ refusedAgents: refusedAgents.map((a) => a.name) }, "system policy set");
    return { policy, refusedAgents };
  }

  close(): void {
    this.stopWatch();
  }
}

/** What the load knows of a job: whose it is, whether it waits or runs, and what the store keeps of it. */
interface Counted {
  owner: string;
  /** Waiting (`accepted` or `queued`), running, or neither (ended, say). */
  state: "queued" | "running" | undefined;
  /** The size of its record, as stored. */
  bytes: number;
  /** The sizes of its artifacts, summed (from its record). */
  artifacts: number;
}

function countedOf(job: IndexedJob): Counted {
  const state = job.state === "running" ? "running" : job.state === "accepted" || job.state === "queued" ? "queued" : undefined;
  return { owner: job.owner, state, bytes: job.bytes, artifacts: job.artifacts };
}

const mib = (n: number) => (n < 1024 ** 2 ? `${Math.round(n / 1024)} KiB` : `${Math.round((n / 1024 ** 2) * 10) / 10} MiB`);

/**
 * How many jobs each user has waiting and running, how many bytes the store keeps of each user's
 * jobs (records and artifacts, of every job not yet deleted) and of artifacts in all, and how many
 * jobs (and bytes of records) the whole system has waiting, counted from the dispatcher's watch
 * of the job records. The counts trail the bucket by the watch's delay, so a burst of submissions
 * can pass a quota or a queue limit by the few that are in flight at once. It also holds the
 * store's room as this dispatcher knows it (`StoreRoom`), for the headroom.
 */
export class JobLoad {
  /** Jobs counted as waiting while their records are written (`counted`), until the index has them. */
  private readonly holds = new Map<string, Counted>();
  private readonly counts = new Map<string, { queued: number; running: number }>();
  /** Bytes kept of each user's jobs: records and artifacts. */
  private readonly stored = new Map<string, number>();
  /** Artifacts kept in all, in bytes. */
  private artifactsKept = 0;
  /** Jobs waiting to start in the whole system, and the bytes of their records. */
  private readonly queue = { jobs: 0, bytes: 0 };
  private store: StoreRoom | undefined;

  /** Counts the jobs of `index`, following each change it has. */
  constructor(private readonly index: JobIndex) {
    index.onChange((id, before, after) => {
      const held = this.holds.get(id);
      if (held) {
        // Its record, seen: it takes the hold's place.
        this.holds.delete(id);
        this.add(held, -1);
      }
      if (before) this.add(countedOf(before), -1);
      if (after) this.add(countedOf(after), 1);
    });
  }

  /**
   * Notes a job record's latest value (undefined: deleted) and its size as stored: in the index,
   * which counts it here. Admission does, not waiting for the watch.
   */
  readonly observe = (key: string, job: JobRecord | undefined, bytes?: number): void => {
    this.index.observe(key, job, bytes);
  };

  private add(job: Counted, n: number): void {
    if (job.state) {
      const c = this.counts.get(job.owner) ?? { queued: 0, running: 0 };
      c[job.state] += n;
      if (c.queued === 0 && c.running === 0) this.counts.delete(job.owner);
      else this.counts.set(job.owner, c);
    }
    const kept = (this.stored.get(job.owner) ?? 0) + n * (job.bytes + job.artifacts);
    if (kept > 0) this.stored.set(job.owner, kept);
    else this.stored.delete(job.owner);
    this.artifactsKept += n * job.artifacts;
    if (job.state === "queued") {
      this.queue.jobs += n;
      this.queue.bytes += n * job.bytes;
    }
  }

  of(owner: string): { queued: number; running: number } {
    return this.counts.get(owner) ?? { queued: 0, running: 0 };
  }

  /** Bytes the store keeps of `owner`'s jobs: their records as stored and their artifacts. */
  storedOf(owner: string): number {
    return this.stored.get(owner) ?? 0;
  }

  /** Bytes of artifacts the store keeps, every job's. */
  get artifacts(): number {
    return this.artifactsKept;
  }

  /** Jobs waiting to start in the whole system, and the bytes of their records. */
  get queued(): { jobs: number; bytes: number } {
    return { ...this.queue };
  }

  /** The room in JetStream's store as this dispatcher knows it; admissions keep it current (`StoreRoom.refresh`). */
  storeOf(topology: Topology): StoreRoom {
    this.store ??= new StoreRoom(topology);
    return this.store;
  }

  /**
   * Refuses a new job of `caller` when it has as many waiting or running as its quota allows, or
   * keeps as many bytes as its quota allows. Admins have no quota.
   */
  check(caller: Identity, policy: SystemPolicy): void {
    if (caller.role === "admin") return;
    const quota = quotaOf(policy, caller.user);
    const now = this.of(caller.user);
    for (const state of ["queued", "running"] as const) {
      const most = quota[state];
      if (most !== undefined && now[state] >= most) {
        throw new BoxcarError(
          ErrorCode.quotaExceeded,
          `${caller.user} has ${now[state]} jobs ${state} and a quota of ${most}: wait for some to finish, or ask an admin for a larger quota`,
        );
      }
    }
    const kept = this.storedOf(caller.user);
    if (quota.bytes !== undefined && kept >= quota.bytes) {
      throw new BoxcarError(
        ErrorCode.storageQuotaExceeded,
        `${caller.user}'s jobs keep ${mib(kept)} of records and artifacts, and ${caller.user}'s quota is ${mib(quota.bytes)}: ` +
          "delete ended jobs (retention does after its period; an admin can with boxcar clean), or ask an admin for a larger quota",
      );
    }
  }

  /**
   * Refuses a new job of `holder` past its quota (as `check`), else counts it at once as waiting,
   * under its id, while `write` writes its record: admissions at once through one dispatcher (a
   * workflow step's fan-out) cannot all pass the quota. Its record, observed, takes the hold's
   * place; a `write` that fails lets go of it.
   */
  async counted<T>(holder: Identity, id: string, policy: SystemPolicy, write: () => Promise<T>): Promise<T> {
    this.check(holder, policy);
    if (this.index.has(id) || this.holds.has(id)) return write();
    const held: Counted = { owner: holder.user, state: "queued", bytes: 0, artifacts: 0 };
    this.holds.set(id, held);
    this.add(held, 1);
    try {
      return await write();
    } catch (err) {
      if (this.holds.get(id) === held) {
        this.holds.delete(id);
        this.add(held, -1);
      }
      throw err;
    }
  }

  /**
   * Refuses new work, admins' too, when the system holds as many jobs or bytes queued as its
   * policy allows, as many bytes of artifacts as `quotas.artifacts` allows, or when the store
   * has less room than the headroom kept for the jobs already admitted (as last known: see
   * `storeOf`): the store keeps room for the jobs already admitted to run and end.
   */
  checkRoom(policy: SystemPolicy): void {
    const limits = { ...DEFAULT_QUEUE_LIMITS, ...policy.queue };
    const { jobs, bytes } = this.queue;
    if (jobs >= limits.jobs || bytes >= limits.bytes) {
      throw new BoxcarError(
        ErrorCode.queueFull,
        `the queue is full: ${jobs} jobs (${mib(bytes)}) wait to start, and the system policy allows ${limits.jobs} jobs or ${mib(limits.bytes)}; ` +
          "submit again once some have started (an admin can raise queue.jobs / queue.bytes with boxcar policy set)",
      );
    }
    const most = policy.quotas.artifacts;
    if (most !== undefined && this.artifactsKept >= most) {
      throw new BoxcarError(
        ErrorCode.storageQuotaExceeded,
        `the system keeps ${mib(this.artifactsKept)} of artifacts, and the system policy allows ${mib(most)} (quotas.artifacts): ` +
          "submit again once retention or boxcar clean has deleted ended jobs (an admin can raise quotas.artifacts with boxcar policy set)",
      );
    }
    this.store?.check(policy);
  }
}
