import { jsonOf, type Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { followKv, getJson } from "@boxcar/fabric/internal";
import { AgentDefinition, BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { KvEntry } from "@nats-io/kv";

/**
 * The applied agents as this dispatcher knows them: kept by a watch of the agents bucket, so
 * admitting a job asks JetStream for nothing. An agent applied through this dispatcher is known
 * at once; one applied or removed through another is known as soon as the watch brings it, a
 * few milliseconds later. A name the watch has not brought is read from the bucket.
 */
export class AgentCatalog {
  /** By name, with the revision it was stored at; a removed agent is kept without a definition, so an older entry cannot bring it back. */
  private readonly agents = new Map<string, { agent?: AgentDefinition; revision: number }>();
  private stopWatch: () => void = () => {};

  constructor(
    private readonly topology: Topology,
    private readonly log: Logger,
  ) {}

  /** A catalog, started. */
  static async open(topology: Topology, log: Logger): Promise<AgentCatalog> {
    const catalog = new AgentCatalog(topology, log);
    await catalog.start();
    return catalog;
  }

  /** Follows the agents bucket: every agent stored, then each change. */
  async start(): Promise<void> {
    this.stopWatch = await followKv(this.topology.agents, (entry) => this.take(entry));
  }

  /** The agent named `name`; an unknown name is refused with how to apply one. */
  async get(name: string): Promise<AgentDefinition> {
    const known = this.agents.get(name)?.agent;
    if (known) return known;
    const found = await getJson(this.topology.agents, name, AgentDefinition, "agent");
    if (!found) {
      throw new BoxcarError(
        ErrorCode.unknownAgent,
        `no agent named ${JSON.stringify(name)}: apply it with \`boxcar agent apply -f FILE\``,
        {
          issues: [{ path: "agent", message: "unknown agent" }],
        },
      );
    }
    return found.value;
  }

  /** Stores `agent`; resolves with whether no agent of that name was there before. */
  async apply(agent: AgentDefinition): Promise<boolean> {
    const previous = await this.topology.agents.get(agent.name);
    this.learn(agent.name, await this.topology.agents.put(agent.name, JSON.stringify(agent)), agent);
    return previous?.operation !== "PUT";
  }

  async remove(name: string): Promise<void> {
    await this.topology.agents.delete(name);
    // Gone at once here; an older entry the watch still brings cannot bring it back.
    this.agents.set(name, { revision: this.agents.get(name)?.revision ?? 0 });
  }

  /** Keeps what the bucket held at `revision`, unless a later revision is known already. */
  private learn(name: string, revision: number, agent?: AgentDefinition): void {
    if ((this.agents.get(name)?.revision ?? 0) >= revision) return;
    this.agents.set(name, agent ? { agent, revision } : { revision });
  }

  /** Stops following the bucket (an agent it does not know is still read from there). */
  close(): void {
    this.stopWatch();
  }

  private take(entry: KvEntry): void {
    if (entry.operation !== "PUT") {
      this.learn(entry.key, entry.revision);
      return;
    }
    const parsed = AgentDefinition.safeParse(jsonOf(entry));
    if (!parsed.success) {
      // Read from the bucket on use, where the error names what is wrong.
      this.log.warn({ agent: entry.key, revision: entry.revision }, "a stored agent does not parse");
      this.learn(entry.key, entry.revision);
      return;
    }
    this.learn(entry.key, entry.revision, parsed.data);
  }
}
