import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { nowIso } from "@boxcar/fabric/internal";
import { type AgentDefinition, BoxcarError, ErrorCode, isTerminal, ownerOf, toErrorInfo } from "@boxcar/protocol";
import { JobTransitions } from "@boxcar/protocol/internal";
import { AckPolicy, type ConsumerMessages, type JsMsg } from "@nats-io/jetstream";
import { z } from "zod";
import { publishWorkItem, type WorkPublishing } from "../jobs/work-items.js";
import type { ConcurrencyLimits } from "../limits/concurrency.js";

/** What releasing a delayed job needs: its agent, and its places under the agent's concurrency limits. */
type LaterWorkContext = WorkPublishing & { agents: Pick<AgentCatalog, "get">; limits: ConcurrencyLimits };

import type { AgentCatalog } from "../catalog/agent-catalog.js";
import type { Entered } from "../limits/concurrency.js";
import { LimitBusy } from "../limits/limit-state.js";
import { pausedUntil, reserveFor } from "../limits/rate-limit.js";

/** What a delayed job waits as, on `<prefix>.work.~later.<jobId>`. */
export const LaterMarker = z.looseObject({ jobId: z.string(), runAt: z.iso.datetime() });

/** How early a marker may be taken for due (the dispatchers' clocks differ a little). */
const EARLY_MS = 20;
/** How long a due job whose item cannot be made yet (its agent cannot be read, say) waits before it is tried again. */
const RETRY_MS = 30_000;

/**
 * Delayed jobs (docs/flow-control.md#delayed-jobs): a delayed job is admitted at once, and a
 * marker of it waits on `<prefix>.work.~later.<jobId>` in the work stream, which the dispatchers
 * share a consumer of. A marker taken before its time goes back to JetStream with a delay of
 * what is left (one `nak`: JetStream keeps the time, no process does); taken at its time, the
 * job's work item is published to its pool (or its session's worker) as any job's, and the
 * marker is done. Workers never see markers, so the pools' consumers hold no waiting job.
 */
export class LaterConsumer {
  private messages: ConsumerMessages | undefined;
  private done: Promise<void> = Promise.resolve();

  constructor(
    private readonly topology: Topology,
    private readonly ctx: LaterWorkContext,
    private readonly log: Logger,
  ) {}

  /** Makes the shared consumer if it is missing, and takes its markers as they come. */
  async start(): Promise<void> {
    const { topology, ctx, log } = this;
    const { jsm, js, names } = topology;
    await jsm.consumers.info(names.streams.work, names.laterConsumer).catch(async () => {
      await jsm.consumers.add(names.streams.work, {
        durable_name: names.laterConsumer,
        filter_subject: names.subjects.laterWorkAll,
        ack_policy: AckPolicy.Explicit,
        ack_wait: topology.options.ackWaitMs * 1_000_000,
        // Every waiting job is one delivered and handed back: no bound on how many wait.
        max_ack_pending: -1,
      });
    });
    const consumer = await js.consumers.get(names.streams.work, names.laterConsumer);
    const messages = await consumer.consume({ max_messages: 64 });
    this.messages = messages;
    this.done = (async () => {
      for await (const msg of messages) {
        await due(topology, ctx, msg).catch((err: unknown) => {
          log.warn({ err, seq: msg.seq }, "could not publish a delayed job's work item; trying again");
          msg.nak(RETRY_MS);
        });
      }
    })();
  }

  /** Takes no more markers, and waits for the one under way. */
  async stop(): Promise<void> {
    await this.messages?.close();
    await this.done;
  }
}

/** Handles one marker: back until its time, or its job's work item published (or nothing, for a job that ended meanwhile). */
async function due(topology: Topology, ctx: LaterWorkContext, msg: JsMsg): Promise<void> {
  const parsed = LaterMarker.safeParse(safeJson(msg));
  if (!parsed.success) {
    msg.term("not a delayed job's marker");
    return;
  }
  const { jobId, runAt } = parsed.data;
  const left = Date.parse(runAt) - Date.now();
  if (left > EARLY_MS) {
    msg.nak(left);
    return;
  }
  const found = await topology.jobStore.read(jobId);
  if (!found || isTerminal(found.record.state) || found.record.runAt === undefined) {
    // Ended meanwhile, or released already (this marker delivered again): nothing to publish.
    msg.ack();
    return;
  }
  let agent: AgentDefinition;
  let turn: number | undefined;
  let entered: Entered | undefined;
  const { spec } = found.record;
  const job = { id: jobId, spec: spec ?? { input: null, labels: {} }, owner: ownerOf(found.record) };
  try {
    agent = await ctx.agents.get(found.record.agent);
    // A job delayed by its submitter takes its turn under its agent's rate limit now (one whose
    // turn came while its provider asked the limit to pause, a new one after the pause),
    const paused = agent.rateLimit && found.record.rateLimited ? await pausedUntil(ctx.limits.entries, agent, job) : undefined;
    if (agent.rateLimit && (!found.record.rateLimited || paused !== undefined)) {
      const deadlineAt = found.record.deadlineAt === undefined ? undefined : Date.parse(found.record.deadlineAt);
      turn = await reserveFor(ctx.limits.entries, agent, job, Date.now(), deadlineAt);
    }
    // and when it may start, its places under its concurrency limits (or waits for one).
    if (turn === undefined || turn - Date.now() <= EARLY_MS) entered = await ctx.limits.enter(agent, job, found.record.pool);
  } catch (err) {
    const never = [ErrorCode.unknownAgent, ErrorCode.unavailable, ErrorCode.conflict] as string[];
    // A limit too busy for now is tried again (the marker handed back).
    if (!(err instanceof BoxcarError && never.includes(err.code)) || err instanceof LimitBusy) throw err;
    // Removed while the job waited, no turn for it in time, or no place and a strategy that drops
    // new jobs: it can never run.
    await topology.jobStore.change(found, (job) => JobTransitions.refuse(job, toErrorInfo(err), nowIso()));
    msg.ack();
    return;
  }
  if (turn !== undefined && turn - Date.now() > EARLY_MS) {
    // Waits again, for its turn, as a new marker.
    const at = turn;
    const postponed = await topology.jobStore.change(found, (job) => JobTransitions.postpone(job, at));
    if (postponed.written) await publishWorkItem(topology, postponed.handle.record, agent, ctx, `${jobId}:limited:${at}`);
    msg.ack();
    return;
  }
  // Released before its item goes: a marker delivered again finds it released, and a dispatcher
  // that dies in between leaves a queued job with no item, which `RecoverySweep` enqueues.
  const released = await topology.jobStore.change(found, (current) => JobTransitions.release(current, entered?.concurrency));
  if (released.written) {
    const record = released.handle.record;
    await publishWorkItem(topology, record, agent, ctx, `${jobId}:due`);
  } else if (entered) {
    // It ended meanwhile, or a delivery of its marker before this one released it (and it may
    // wait for a place this one took): the places this one took are not its to hold.
    await ctx.limits.leave(entered.taken, jobId);
  }
  msg.ack();
}

function safeJson(msg: JsMsg): unknown {
  try {
    return msg.json();
  } catch {
    return undefined;
  }
}
