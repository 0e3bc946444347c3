import { jsonOf, type Logger } from "@boxcar/common";
import { followKv, listJson, type Topology } from "@boxcar/fabric";
import {
  AgentDefinition,
  API_CONTRACT,
  ApiEndpoint,
  BoxcarError,
  DEFAULT_QUEUE_LIMITS,
  ErrorCode,
  type ErrorIssue,
  type Identity,
  type JobRecord,
  ownerOf,
  POLICY_KEY,
  parseWith,
  policyViolations,
  quotaOf,
  SystemPolicy,
} from "@boxcar/protocol";
import type { KvEntry } from "@nats-io/kv";

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

/** A job the load counts: waiting (`queued`) or `running`. */
interface Counted {
  owner: string;
  state: "queued" | "running";
  /** The size of its record, as stored. */
  bytes: number;
}

/**
 * How many jobs each user has waiting and running, and how many (and how many bytes of records)
 * the whole system has waiting, counted from the dispatcher's watch of the job records. The
 * counts trail the bucket by the watch's delay, so a burst of submissions can pass a quota or a
 * queue limit by the few that are in flight at once.
 */
export class JobLoad {
  private readonly jobs = new Map<string, Counted>();
  private readonly counts = new Map<string, { queued: number; running: number }>();
  /** Jobs waiting to start in the whole system, and the bytes of their records. */
  private readonly queue = { jobs: 0, bytes: 0 };

  readonly observe = (key: string, job: JobRecord | undefined, bytes = 0): void => {
    const before = this.jobs.get(key);
    if (before) this.add(before, -1);
    const state = job?.state === "running" ? "running" : job?.state === "accepted" || job?.state === "queued" ? "queued" : undefined;
    if (job && state) {
      const now: Counted = { owner: ownerOf(job), state, bytes };
      this.jobs.set(key, now);
      this.add(now, 1);
    } else this.jobs.delete(key);
  };

  private add(job: Counted, n: number): void {
    const c = this.counts.get(job.owner) ?? { queued: 0, running: 0 };
    c[job.state] += n;
    if (c.queued === 0 && c.running === 0) this.counts.delete(job.owner);
    else this.counts.set(job.owner, c);
    if (job.state === "queued") {
      this.queue.jobs += n;
      this.queue.bytes += n * job.bytes;
    }
  }

  of(owner: string): { queued: number; running: number } {
    return this.counts.get(owner) ?? { queued: 0, running: 0 };
  }

  /** Jobs waiting to start in the whole system, and the bytes of their records. */
  get queued(): { jobs: number; bytes: number } {
    return { ...this.queue };
  }

  /** Refuses a new job of `caller` when it has as many waiting or running as its quota allows. Admins have no quota. */
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
  }

  /**
   * Refuses a new job of `holder` past its quota (as `check`), else counts it at once as waiting,
   * under its id, while `write` writes its record: admissions at once through one dispatcher (a
   * workflow step's fan-out) cannot all pass the quota. Its record, observed, takes the hold's
   * place; a `write` that fails lets go of it.
   */
  async counted<T>(holder: Identity, id: string, policy: SystemPolicy, write: () => Promise<T>): Promise<T> {
    this.check(holder, policy);
    if (this.jobs.has(id)) return write();
    const held: Counted = { owner: holder.user, state: "queued", bytes: 0 };
    this.jobs.set(id, held);
    this.add(held, 1);
    try {
      return await write();
    } catch (err) {
      if (this.jobs.get(id) === held) this.observe(id, undefined);
      throw err;
    }
  }

  /**
   * Refuses new work, admins' too, when the system holds as many jobs or bytes queued as its
   * policy allows: the store keeps room for the jobs already admitted to run and end.
   */
  checkRoom(policy: SystemPolicy): void {
    const limits = { ...DEFAULT_QUEUE_LIMITS, ...policy.queue };
    const { jobs, bytes } = this.queue;
    if (jobs < limits.jobs && bytes < limits.bytes) return;
    const mib = (n: number) => (n < 1024 ** 2 ? `${Math.round(n / 1024)} KiB` : `${Math.round((n / 1024 ** 2) * 10) / 10} MiB`);
    throw new BoxcarError(
      ErrorCode.queueFull,
      `the queue is full: ${jobs} jobs (${mib(bytes)}) wait to start, and the system policy allows ${limits.jobs} jobs or ${mib(limits.bytes)}; ` +
        "submit again once some have started (an admin can raise queue.jobs / queue.bytes with boxcar policy set)",
    );
  }
}
