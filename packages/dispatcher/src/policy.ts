import { jsonOf, type Logger } from "@boxcar/client";
import { followKv, listJson, type Topology } from "@boxcar/fabric";
import {
  AgentDefinition,
  BoxcarError,
  ErrorCode,
  type ErrorIssue,
  type Identity,
  type JobRecord,
  ownerOf,
  parseWith,
  policyViolations,
  quotaOf,
  SystemPolicy,
} from "@boxcar/protocol";
import type { KvEntry } from "@nats-io/kv";

/** The key of the system policy in the policy bucket. */
const POLICY_KEY = "system";

/**
 * The admin's system policy as this dispatcher knows it: read at start, then kept current by a
 * watch, so checking it adds no request to a submission.
 */
export class PolicyBook {
  private current: SystemPolicy = SystemPolicy.parse({});
  private stopWatch: () => void = () => {};

  private constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
  ) {}

  static async open(topology: Topology, log: Logger): Promise<PolicyBook> {
    const book = new PolicyBook(topology, log);
    const stored = await topology.policy.get(POLICY_KEY);
    if (stored) book.take(stored);
    // The watch delivers the stored value again (or a newer one), then every change.
    book.stopWatch = await followKv(topology.policy, (entry) => book.take(entry), { key: POLICY_KEY });
    return book;
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
    const policy = parseWith(SystemPolicy, (body as { policy?: unknown } | null)?.policy, "policy");
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

/**
 * How many jobs each user has waiting and running, counted from the dispatcher's watch of the
 * job records. The count trails the bucket by the watch's delay, so a burst of submissions can
 * pass a quota by the few that are in flight at once.
 */
export class OwnerLoad {
  private readonly jobs = new Map<string, { owner: string; state: "queued" | "running" }>();
  private readonly counts = new Map<string, { queued: number; running: number }>();

  readonly observe = (key: string, job: JobRecord | undefined): void => {
    const before = this.jobs.get(key);
    if (before) this.add(before.owner, before.state, -1);
    const state = job?.state === "running" ? "running" : job?.state === "accepted" || job?.state === "queued" ? "queued" : undefined;
    if (job && state) {
      this.jobs.set(key, { owner: ownerOf(job), state });
      this.add(ownerOf(job), state, 1);
    } else this.jobs.delete(key);
  };

  private add(owner: string, state: "queued" | "running", n: number): void {
    const c = this.counts.get(owner) ?? { queued: 0, running: 0 };
    c[state] += n;
    if (c.queued === 0 && c.running === 0) this.counts.delete(owner);
    else this.counts.set(owner, c);
  }

  of(owner: string): { queued: number; running: number } {
    return this.counts.get(owner) ?? { queued: 0, running: 0 };
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
}
