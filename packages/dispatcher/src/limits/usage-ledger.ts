import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { isRevisionConflict } from "@boxcar/fabric/internal";
import {
  BoxcarError,
  type Budget,
  ErrorCode,
  type Identity,
  JobEvent,
  type SystemPolicy,
  type Usage,
  type UsageReply,
} from "@boxcar/protocol";
import { addUsage, NO_USAGE, parseUsageEntry, seesAll, spent, usageDay, usageKey } from "@boxcar/protocol/internal";
import { AckPolicy, type ConsumerMessages, DeliverPolicy, type JsMsg } from "@nats-io/jetstream";
import type { KV } from "@nats-io/kv";
import type { DispatcherMetrics } from "../dispatcher-metrics.js";
import type { JobIndex } from "../jobs/job-index.js";
import { cancelJob } from "../jobs/jobs.js";

/** What summing usage needs: the budgets, the jobs to stop when one is spent, and the meters. */
interface LedgerParts {
  policy: () => SystemPolicy;
  index: JobIndex;
  metrics?: DispatcherMetrics | undefined;
}

/**
 * Usage and budgets (docs/flow-control.md#usage-and-budgets). A worker publishes what each
 * attempt's calls used as a `usage` job event of its own; the dispatchers share one consumer of
 * those, `usage`, which hands them out one at a time, and sum each into its day's entries in the
 * usage bucket (`<day>.agent.<agent>`, `<day>.user.<owner>`). Each entry keeps the stream
 * sequence of the last event summed into it, so an event delivered again (its dispatcher died
 * before its ack) is not counted twice. Budgets (the system policy's) are read from there: a job
 * whose agent or user has spent its day's budget is refused (`budget_exceeded`), and a budget
 * that says `stop` cancels their running jobs, and those queued to start that day, once an event
 * spends it.
 */
export class UsageLedger {
  private made = false;
  private messages: ConsumerMessages | undefined;
  private done: Promise<void> = Promise.resolve();

  constructor(
    private readonly topology: Topology,
    private readonly parts: LedgerParts,
    private readonly log: Logger,
  ) {}

  /** Makes the shared `usage` consumer if it is missing, and sums its events as they come. */
  async start(): Promise<void> {
    const { topology, log } = this;
    const { jsm, js, names } = topology;
    await jsm.consumers.info(names.streams.events, names.usageConsumer).catch(async () => {
      await jsm.consumers.add(names.streams.events, {
        durable_name: names.usageConsumer,
        filter_subject: names.subjects.event("job", "*", "usage", "*"),
        deliver_policy: DeliverPolicy.All,
        ack_policy: AckPolicy.Explicit,
        ack_wait: topology.options.ackWaitMs * 1_000_000,
        // One at a time: an entry's sequence then says which events it holds.
        max_ack_pending: 1,
      });
    });
    const consumer = await js.consumers.get(names.streams.events, names.usageConsumer);
    const messages = await consumer.consume({ max_messages: 16 });
    this.messages = messages;
    this.done = (async () => {
      for await (const msg of messages) {
        await this.sum(msg, this.parts).then(
          () => msg.ack(),
          (err: unknown) => {
            log.warn({ err, seq: msg.seq }, "could not sum a usage event; trying again");
            msg.nak(1_000);
          },
        );
      }
    })();
  }

  private async sum(msg: JsMsg, parts: LedgerParts) {
    const parsed = JobEvent.safeParse(safeJson(msg));
    if (!parsed.success || parsed.data.type !== "usage" || !parsed.data.usage) return; // not one: nothing to sum
    const event = parsed.data;
    const usage = event.usage as Usage;
    const owner = event.owner ?? "local";
    const day = usageDay(event.at);
    const agentTotal = await this.add(usageKey(day, "agent", event.agent), usage, msg.seq);
    const userTotal = await this.add(usageKey(day, "user", owner), usage, msg.seq);
    if (agentTotal) parts.metrics?.usage(event.agent, usage);
    // A budget spent by this event that says `stop` cancels what runs under it.
    const { budgets } = parts.policy();
    const stops: [Budget | undefined, Usage | undefined, (job: { agent: string; owner: string }) => boolean][] = [
      [budgets.agents[event.agent], agentTotal, (job) => job.agent === event.agent],
      [budgets.users[owner], userTotal, (job) => job.owner === owner],
    ];
    // Its jobs queued to start today are stopped too (not those delayed past midnight UTC, when
    // the budget renews).
    const renews = Date.parse(`${day}T00:00:00.000Z`) + 24 * 3_600_000;
    for (const [budget, total, covers] of stops) {
      if (budget?.onExceeded !== "stop" || !total || !spent(budget, total)) continue;
      for (const [id, job] of parts.index.newestFirst()) {
        if ((job.state !== "running" && job.state !== "queued") || !covers(job)) continue;
        if (job.state === "queued") {
          const runAt = (await this.topology.jobStore.read(id))?.record.runAt;
          if (runAt !== undefined && Date.parse(runAt) >= renews) continue;
        }
        await cancelJob(this.topology, id).catch((err: unknown) =>
          this.log.warn({ err, jobId: id }, "could not stop a job past its budget"),
        );
      }
    }
  }

  /** Adds `usage` to an entry, unless event `seq` is in it already; the entry's total, or undefined when it was. */
  private async add(key: string, usage: Usage, seq: number): Promise<Usage | undefined> {
    for (;;) {
      // The bucket is made by the first usage summed: a system whose agents report none has none.
      const bucket = await this.topology.usage();
      this.made = true;
      const entry = await bucket.get(key);
      const held = entry?.operation === "PUT" ? parseUsageEntry(entry.string()) : undefined;
      if (held && held.seq >= seq) return undefined;
      const total = addUsage(held?.usage ?? NO_USAGE, usage);
      try {
        const next = JSON.stringify({ ...total, seq });
        if (entry?.operation === "PUT") await bucket.update(key, next, entry.revision);
        else await bucket.create(key, next);
        return total;
      } catch (err) {
        if (!isRevisionConflict(err)) throw err;
      }
    }
  }

  /** A day's usage of one agent or user (`kind`), nothing when it has none. */
  async of(day: string, kind: "agent" | "user", name: string): Promise<Usage> {
    const bucket = await this.existing();
    const entry = bucket ? await bucket.get(usageKey(day, kind, name)) : undefined;
    return (entry?.operation === "PUT" ? parseUsageEntry(entry.string()) : undefined)?.usage ?? NO_USAGE;
  }

  /** Refuses a job of `agent` for `owner` when either has spent its budget for today (`budget_exceeded`). */
  async checkBudgets(policy: SystemPolicy, agent: string, owner: string): Promise<void> {
    const day = usageDay(Date.now());
    const budgets: [string, Budget | undefined, "agent" | "user", string][] = [
      [`agent ${agent}`, policy.budgets.agents[agent], "agent", agent],
      [`user ${owner}`, policy.budgets.users[owner], "user", owner],
    ];
    for (const [who, budget, kind, name] of budgets) {
      if (!budget) continue;
      const used = await this.of(day, kind, name);
      if (spent(budget, used)) {
        throw new BoxcarError(
          ErrorCode.budgetExceeded,
          `${who} has spent its budget for ${day} (UTC): cost ${used.cost}${budget.cost !== undefined ? ` of ${budget.cost}` : ""}, ${used.tokensIn + used.tokensOut} tokens${budget.tokens !== undefined ? ` of ${budget.tokens}` : ""}; it renews at midnight UTC, or an admin raises it`,
        );
      }
    }
  }

  /** `usage.get`: a day's usage per agent and per user; a submitter sees its own only. */
  async report(day: string, caller: Identity): Promise<UsageReply> {
    const reply: UsageReply = { day, agents: {}, users: {} };
    if (!seesAll(caller.role)) {
      reply.users[caller.user] = await this.of(day, "user", caller.user);
      return reply;
    }
    const bucket = await this.existing();
    const keys: string[] = [];
    if (bucket) for await (const key of await bucket.keys(`${day}.>`)) keys.push(key);
    for (const key of keys.sort()) {
      const [, kind, ...rest] = key.split(".");
      const name = rest.join(".");
      const usage = await this.of(day, kind as "agent" | "user", name);
      if (kind === "agent") reply.agents[name] = usage;
      else if (kind === "user") reply.users[name] = usage;
    }
    return reply;
  }

  /** The usage bucket if any usage was ever summed (reads make no bucket). */
  private async existing(): Promise<KV | undefined> {
    if (!this.made) {
      const { jsm, names } = this.topology;
      this.made = await jsm.streams.info(`KV_${names.buckets.usage}`).then(
        () => true,
        () => false,
      );
      if (!this.made) return undefined;
    }
    return this.topology.usage();
  }

  /** Sums no more events, and waits for the one under way. */
  async stop(): Promise<void> {
    await this.messages?.close();
    await this.done;
  }
}

function safeJson(msg: JsMsg): unknown {
  try {
    return msg.json();
  } catch {
    return undefined;
  }
}
