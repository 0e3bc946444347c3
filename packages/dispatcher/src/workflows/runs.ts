import { createHash } from "node:crypto";
import type { Topology } from "@boxcar/fabric";
import { getJson, nowIso, publishEvent } from "@boxcar/fabric/internal";
import {
  type ApproveStepRequest,
  BoxcarError,
  ErrorCode,
  type Identity,
  JobRecord,
  type ListRunsReply,
  ListRunsRequest,
  ownerOf,
  PROTOCOL_VERSION,
  parseWith,
  StartRunRequest,
  toErrorInfo,
  type WorkflowEvent,
  WorkflowRun,
} from "@boxcar/protocol";
import { mayAccess } from "@boxcar/protocol/internal";
import { type AdmissionContext, admitContinued } from "../intake/admission.js";
import { newJobId } from "../jobs/job-id.js";
import { cancelJob, caughtUp, LIST_REPLY_BUDGET, signalJob } from "../jobs/jobs.js";
import { KeyTimers } from "../loops/key-timers.js";
import { PassPerKey } from "../loops/pass-per-key.js";
import { jobsToRead, type PlannedStart, planRun } from "./plan.js";
import { factsOf, type RunFacts, type RunIndex } from "./run-index.js";
import {
  cancelRun,
  createRun,
  decideApproval,
  type RunChange,
  type RunEventDraft,
  recordStart,
  type StartOutcome,
} from "./run-transitions.js";
import { stepLimitsOf, withinStep } from "./step-limits.js";

/** Rounds of plan-and-write one `advance` may take before it leaves the rest to the next trigger. */
const MAX_ROUNDS = 50;
/** How soon a run whose advance failed (NATS trouble) is advanced again. */
const RETRY_MS = 2_000;

export type RunsContext = AdmissionContext;

/**
 * Workflow runs: their records in the workflows bucket, changed only by compare-and-swap, and
 * only through the run's transitions (`run-transitions.ts`; an advance is `planRun` of them).
 * This class reads what a transition needs, writes its result, then does what it says (admit a step's job under a key unique to the run, step and item; cancel jobs;
 * publish events). Any dispatcher may advance any run, at any time, as often as it likes.
 */
export class Runs {
  /** Advances in flight, one per run, so a burst of job updates makes one more pass, not many. */
  private readonly advancing = new PassPerKey(
    (id) => this.advanceOnce(id),
    (err, id) => {
      this.ctx.log.error({ err, runId: id }, "could not advance a workflow run; trying again");
      this.retryLater(id);
    },
  );
  /** Advances to try again after a failure, one per run. */
  private readonly retries = new KeyTimers();

  constructor(
    private readonly topology: Topology,
    private readonly ctx: RunsContext,
    /** What `list` walks; told of each run this dispatcher starts. */
    private readonly index: RunIndex,
  ) {}

  /** Starts a run for `caller`; `traceparent`, the start request's span, is the trace its jobs join. */
  async start(raw: unknown, caller: Identity, traceparent?: string): Promise<{ run: WorkflowRun; duplicate: boolean }> {
    const req = parseWith(StartRunRequest, raw, "request");
    const { workflow } = req;
    const owner = caller.user;
    for (const [i, step] of workflow.steps.entries()) {
      if (step.agent === undefined) continue; // an approval step
      try {
        const agent = await this.ctx.agents.get(step.agent);
        this.ctx.workers.checkServable(agent, step.pool ?? agent.pool);
      } catch (err) {
        const error = toErrorInfo(err);
        if (error.code === ErrorCode.internal) throw err;
        throw new BoxcarError(error.code as ErrorCode, `step ${step.name}: ${error.message}`, {
          issues: [{ path: `workflow.steps[${i}].agent`, message: error.message }],
        });
      }
    }

    // A caller's key is scoped to its owner: another user's equal key starts another run.
    const id = req.idempotencyKey ? runIdForKey(`owner:${owner}:${req.idempotencyKey}`) : `wf-${newJobId()}`;
    // A start sent again (its key's run exists) gets that run back, whatever its owner's quota now.
    if (req.idempotencyKey) {
      const existing = await getJson(this.topology.workflows, id, WorkflowRun, "workflow run");
      if (existing) return { run: existing.value, duplicate: true };
    }
    // Its owner's quota, now and for each of its jobs as it is admitted (docs/security.md#admin-policy-and-quotas).
    this.ctx.load.check(caller, this.ctx.policy.policy);
    const created = createRun({ id, workflow, input: req.input, labels: req.labels, owner, role: caller.role, traceparent }, nowIso());
    const { run } = created;
    try {
      await this.topology.workflows.create(id, JSON.stringify(run));
    } catch {
      const existing = await getJson(this.topology.workflows, id, WorkflowRun, "workflow run");
      if (existing) return { run: existing.value, duplicate: true };
      throw new BoxcarError(ErrorCode.conflict, `could not create run ${id}; try again`);
    }
    this.index.observe(id, run);
    await this.publishAll(created);
    this.ctx.log.info({ runId: id, workflow: workflow.name }, "workflow started");
    await this.advance(id);
    return { run: (await this.get(id)) ?? run, duplicate: false };
  }

  async get(id: string): Promise<WorkflowRun | undefined> {
    return (await getJson(this.topology.workflows, id, WorkflowRun, "workflow run"))?.value;
  }

  /** The run; one that `caller` may not see is not found, as one that does not exist. */
  async require(id: string, caller: Identity): Promise<WorkflowRun> {
    const run = await this.get(id);
    if (!run || !mayAccess(caller, ownerOf(run))) throw new BoxcarError(ErrorCode.notFound, `no workflow run ${id}`);
    return run;
  }

  /**
   * The run as `workflows.get` reads it: to whoever may see it, and to a user its owner named an
   * approver of one of its steps (who decides from its page); to no one else.
   */
  async read(id: string, caller: Identity): Promise<WorkflowRun> {
    const run = await this.get(id);
    const approver = run?.workflow.steps.some((step) => step.approval?.approvers.includes(caller.user)) ?? false;
    if (!run || !(mayAccess(caller, ownerOf(run)) || (caller.role === "submitter" && approver))) {
      throw new BoxcarError(ErrorCode.notFound, `no workflow run ${id}`);
    }
    return run;
  }

  /**
   * Runs `caller` may see, newest first, a page at a time: the index says which match, and only
   * the page's records are read (each checked again, as the index trails the bucket). A page
   * ends at the limit, or before the reply would pass the byte budget (as `jobs.list`).
   */
  async list(raw: unknown, caller: Identity): Promise<ListRunsReply> {
    const req = parseWith(ListRunsRequest, raw, "request");
    await caughtUp(this.index);
    // Awaiting: the runs a step of which waits for the caller's decision (which it may read).
    const whose = req.awaiting
      ? (run: RunFacts) =>
          run.deciders.length > 0 && (caller.role === "admin" || (caller.role === "submitter" && run.deciders.includes(caller.user)))
      : (run: RunFacts) => mayAccess(caller, run.owner);
    const matches = (run: RunFacts) =>
      whose(run) && (!req.state || run.state === req.state) && (!req.workflow || run.workflow === req.workflow);
    const candidates = this.index.newestFirst(matches, req.after || undefined);
    const runs: WorkflowRun[] = [];
    let bytes = 0;
    let last = -1; // the last candidate taken or skipped
    let full = false;
    while (!full && runs.length < req.limit && last < candidates.length - 1) {
      const slice = candidates.slice(last + 1, last + 1 + req.limit - runs.length);
      for (const run of await Promise.all(slice.map((c) => this.get(c.id)))) {
        if (run && matches(factsOf(run))) {
          const size = Buffer.byteLength(JSON.stringify(run));
          if (runs.length > 0 && bytes + size > LIST_REPLY_BUDGET) {
            full = true;
            break;
          }
          runs.push(run);
          bytes += size;
        }
        last += 1;
      }
    }
    // Only a caller that pages (`after`) is told of more: older clients read replies strictly.
    const next = req.after !== undefined && last >= 0 && last < candidates.length - 1 ? candidates[last]?.order : undefined;
    return { runs, ...(next ? { next } : {}) };
  }

  /**
   * Cancels a run: steps not started never start, and running steps' jobs are cancelled.
   * Idempotent. A run `caller` may not see is not found.
   */
  async cancel(id: string, caller: Identity): Promise<WorkflowRun> {
    for (let tries = 0; tries < 10; tries++) {
      const found = await getJson(this.topology.workflows, id, WorkflowRun, "workflow run");
      if (!found || !mayAccess(caller, ownerOf(found.value))) throw new BoxcarError(ErrorCode.notFound, `no workflow run ${id}`);
      const change = cancelRun(found.value, "cancelled by request", nowIso());
      if (!change) return found.value;
      try {
        await this.topology.workflows.update(id, JSON.stringify(change.run), found.revision);
      } catch {
        continue;
      }
      await this.publishAll(change);
      await this.advance(id); // cancels the running steps' jobs
      return (await this.get(id)) ?? change.run;
    }
    throw new BoxcarError(ErrorCode.conflict, `workflow run ${id} kept changing; try the cancel again`);
  }

  /**
   * An approver's decision on a run's approval step: those the step names (or, naming none, the
   * run's owner) and admins may give it, once, while the step waits. One who may neither see the
   * run nor decide finds no run; one who may see it but not decide is refused (`forbidden`).
   */
  async decide(request: ApproveStepRequest, caller: Identity): Promise<WorkflowRun> {
    const { id, step: name, decision, comment } = request;
    for (let tries = 0; tries < 10; tries++) {
      const found = await getJson(this.topology.workflows, id, WorkflowRun, "workflow run");
      const run = found?.value;
      const step = run?.workflow.steps.find((s) => s.name === name);
      const approvers = step?.approval && step.approval.approvers.length > 0 ? step.approval.approvers : run ? [ownerOf(run)] : [];
      const allowed = caller.role === "admin" || approvers.includes(caller.user);
      if (!found || !run || (!allowed && !mayAccess(caller, ownerOf(run))))
        throw new BoxcarError(ErrorCode.notFound, `no workflow run ${id}`);
      if (!step?.approval)
        throw new BoxcarError(ErrorCode.invalid, `run ${id} has no approval step ${name}`, {
          issues: [{ path: "step", message: "not an approval step" }],
        });
      if (!allowed)
        throw new BoxcarError(
          ErrorCode.forbidden,
          `${caller.user} may not approve or reject step ${name}: its approvers are ${approvers.join(", ")}`,
        );
      const change = decideApproval(run, name, {
        decision: decision === "approve" ? "approved" : "rejected",
        by: caller.user,
        at: nowIso(),
        ...(comment ? { comment } : {}),
      });
      try {
        await this.topology.workflows.update(id, JSON.stringify(change.run), found.revision);
      } catch {
        continue; // changed meanwhile: decide on what it holds now
      }
      await this.publishAll(change);
      await this.advance(id);
      return (await this.get(id)) ?? change.run;
    }
    throw new BoxcarError(ErrorCode.conflict, `workflow run ${id} kept changing; decide again`);
  }

  /**
   * A signal to a run: sent to each of its jobs running now (docs/flow-control.md#signals). What
   * reached each, and what could not (a job between attempts, say), is said; a run with none
   * running is a `conflict`.
   */
  async signal(request: { id: string; name: string; payload: unknown }, caller: Identity) {
    const run = await this.require(request.id, caller);
    const running = Object.values(run.steps).flatMap((step) =>
      step.instances.flatMap((inst) => (inst.state === "running" && inst.jobs.length > 0 ? [inst.jobs.at(-1) as string] : [])),
    );
    if (running.length === 0)
      throw new BoxcarError(ErrorCode.conflict, `workflow run ${run.id} has no job running or queued to signal (it is ${run.state})`);
    const delivered: { jobId: string; file: string; kept?: true }[] = [];
    const missed: { jobId: string; error: ReturnType<typeof toErrorInfo> }[] = [];
    for (const jobId of running) {
      try {
        const { file, kept } = await signalJob(this.topology, { ...request, id: jobId }, caller);
        delivered.push({ jobId, file, ...(kept ? { kept } : {}) });
      } catch (err) {
        missed.push({ jobId, error: toErrorInfo(err) });
      }
    }
    return { run, delivered, missed };
  }

  /** Moves a run on as far as its jobs allow; concurrent calls for one run collapse into one more pass. */
  advance(id: string): Promise<void> {
    return this.advancing.run(id);
  }

  /** After a failure (NATS trouble), advances the run again a little later, unless stopped. */
  private retryLater(id: string): void {
    if (!this.retries.has(id)) this.retries.set(id, RETRY_MS, () => void this.advance(id));
  }

  /** Stops retrying and advancing, and waits for the advances under way. */
  async stop(): Promise<void> {
    this.retries.stop();
    await this.advancing.stop();
  }

  private async advanceOnce(id: string): Promise<void> {
    for (let round = 0; round < MAX_ROUNDS; round++) {
      const found = await getJson(this.topology.workflows, id, WorkflowRun, "workflow run");
      if (!found) return;
      const read = await Promise.all(jobsToRead(found.value).map((jobId) => getJson(this.topology.jobs, jobId, JobRecord, "job record")));
      const jobs = new Map(read.flatMap((job) => (job ? [[job.value.id, job.value] as const] : [])));
      const plan = planRun(found.value, jobs, Date.now());
      if (plan.changed) {
        try {
          await this.topology.workflows.update(id, JSON.stringify(plan.run), found.revision);
        } catch {
          continue; // another dispatcher wrote first: plan again from its record
        }
      }
      for (const event of plan.events) await this.publish(plan.run, event);
      for (const jobId of plan.cancels) {
        await cancelJob(this.topology, jobId).catch((err: unknown) => this.ctx.log.debug({ err, jobId }, "could not cancel a step's job"));
      }
      if (plan.starts.length === 0) return;
      await this.admitStarts(plan.run, plan.starts);
    }
    this.ctx.log.warn({ runId: id }, "workflow run still changing after many rounds; leaving it for the next trigger");
  }

  /** Admits the jobs of instances in `starting`, then records them on the run (or the refusal). */
  private async admitStarts(run: WorkflowRun, starts: PlannedStart[]): Promise<void> {
    const { id } = run;
    const admitted = await Promise.all(
      starts.map(async (start) => {
        try {
          // The step's limits bound its job, and every job its chain hands off to (step-limits.ts).
          const step = run.workflow.steps.find((s) => s.name === start.step);
          const limits = stepLimitsOf(step);
          const spec = limits ? { ...start.spec, ...withinStep(limits, await this.ctx.agents.get(start.spec.agent)) } : start.spec;
          const { job } = await admitContinued(this.topology, spec, this.ctx, {
            owner: ownerOf(run),
            ownerRole: run.role,
            implicitKey: `workflow:${id}:${start.step}:${start.index}`,
            chain: {
              depth: 0,
              history: [],
              limits: run.workflow.limits,
              run: id,
              step: start.step,
              ...(step?.forEach !== undefined ? { index: start.index } : {}),
              ...(run.deadline ? { deadline: run.deadline } : {}),
              ...(limits ? { stepLimits: limits } : {}),
            },
            ...(run.traceparent ? { traceparent: run.traceparent } : {}),
          });
          const outcome: StartOutcome = { jobId: job.id };
          return { start, outcome };
        } catch (err) {
          const error = toErrorInfo(err);
          if (error.code === ErrorCode.internal) throw err;
          const outcome: StartOutcome = { error: { ...error, message: `step ${start.step}: ${error.message}` } };
          return { start, outcome };
        }
      }),
    );
    for (let tries = 0; tries < 10; tries++) {
      const found = await getJson(this.topology.workflows, id, WorkflowRun, "workflow run");
      if (!found) return;
      let next = found.value;
      const changes: RunChange[] = [];
      const orphans: string[] = [];
      for (const { start, outcome } of admitted) {
        const change = recordStart(next, start.step, start.index, outcome);
        if (change) {
          next = change.run;
          changes.push(change);
          continue;
        }
        // The run ended (or another dispatcher recorded it) meanwhile: a job nobody follows is cancelled.
        const inst = next.steps[start.step]?.instances.find((i) => i.index === start.index);
        if ("jobId" in outcome && !inst?.jobs.includes(outcome.jobId)) orphans.push(outcome.jobId);
      }
      if (changes.length > 0) {
        try {
          await this.topology.workflows.update(id, JSON.stringify(next), found.revision);
        } catch {
          continue;
        }
      }
      for (const jobId of orphans) await cancelJob(this.topology, jobId).catch(() => undefined);
      for (const change of changes) await this.publishAll({ run: next, events: change.events });
      return;
    }
  }

  /** Publishes a change's events, in order. */
  private async publishAll({ run, events }: RunChange): Promise<void> {
    for (const event of events) await this.publish(run, event);
  }

  private async publish(run: WorkflowRun, draft: RunEventDraft): Promise<void> {
    const event: WorkflowEvent = {
      v: PROTOCOL_VERSION,
      at: nowIso(),
      kind: "workflow",
      runId: run.id,
      owner: ownerOf(run),
      workflow: run.workflow.name,
      state: run.state,
      ...draft,
    };
    await publishEvent(this.topology, event).catch((err: unknown) =>
      this.ctx.log.warn({ err, runId: run.id, type: draft.type }, "could not publish a workflow event"),
    );
  }
}

/** A run id fixed by an idempotency key, so a repeated start finds the first run. */
function runIdForKey(key: string): string {
  return `wf-k${createHash("sha256").update(key).digest("hex").slice(0, 40)}`;
}
