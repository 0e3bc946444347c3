import { failSpan, SpanKind, startSpan } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { getJson } from "@boxcar/fabric/internal";
import {
  type AgentDefinition,
  BoxcarError,
  type ChainLink,
  ErrorCode,
  type HandoffDecision,
  type HandoffRequest,
  handoffPending,
  isRunFinal,
  type JobRecord,
  type JobSpecInput,
  ownerOf,
  toErrorInfo,
  WorkflowRun,
} from "@boxcar/protocol";
import { DEFAULT_CHAIN_LIMITS, JobTransitions } from "@boxcar/protocol/internal";
import { type AdmissionContext, admitContinued } from "../intake/admission.js";
import { cancelJob } from "../jobs/jobs.js";
import { withinStep } from "./step-limits.js";

/**
 * Turns a succeeded job's handoff request into the next job of its chain, or refuses it with the
 * reason (the chain then ends there). The decision is written on the job's record by
 * compare-and-swap; the next job is admitted under the key `handoff:<jobId>`, so dispatchers that
 * race, or one that died midway and looks again, make one next job.
 */
export async function continueChain(topology: Topology, job: JobRecord, ctx: AdmissionContext): Promise<void> {
  const request = job.result?.handoff;
  if (!request || !handoffPending(job)) return;
  const link = job.chain ?? rootLink(job);
  let decision: HandoffDecision;
  // The next job joins the trace of the job that hands off.
  const { span, traceparent } = startSpan("handoff", job.traceparent, {
    kind: SpanKind.INTERNAL,
    attributes: { "boxcar.job.id": job.id, "boxcar.agent": job.agent, "boxcar.handoff.to": request.to },
  });
  try {
    const from = await ctx.agents.get(job.agent).catch(() => undefined);
    await checkHandoff(topology, job, request, link, from);
    // A hop of a workflow step's chain runs within the step's limits (step-limits.ts).
    const bounds = link.stepLimits ? withinStep(link.stepLimits, await ctx.agents.get(request.to)) : {};
    const next = await admitContinued(topology, { ...nextSpec(job, request), ...bounds }, ctx, {
      owner: ownerOf(job),
      ownerRole: job.role,
      implicitKey: `handoff:${job.id}`,
      chain: {
        root: link.root,
        parent: job.id,
        depth: link.depth + 1,
        history: [...link.history, { jobId: job.id, agent: job.agent, ...(job.result?.summary ? { summary: job.result.summary } : {}) }],
        limits: link.limits,
        ...(link.deadline ? { deadline: link.deadline } : {}),
        ...(link.run ? { run: link.run } : {}),
        ...(link.step ? { step: link.step } : {}),
        ...(link.index !== undefined ? { index: link.index } : {}),
        ...(link.stepLimits ? { stepLimits: link.stepLimits } : {}),
      },
      ...(traceparent ? { traceparent } : {}),
    });
    decision = { to: request.to, jobId: next.job.id };
    span.setAttribute("boxcar.handoff.job.id", next.job.id);
  } catch (err) {
    const error = toErrorInfo(err);
    failSpan(span, error);
    if (error.code === ErrorCode.internal) throw err;
    decision = { to: request.to, error: { ...error, code: ErrorCode.handoffRefused } };
  } finally {
    span.end();
  }
  const decided = await recordDecision(topology, job.id, decision);
  if (!decided) {
    // Another dispatcher decided first (each counts quotas from its own watch, so it may have
    // refused): a next job this one admitted that the decision does not name is nobody's.
    const standing = decision.jobId ? (await topology.jobStore.read(job.id))?.record.handoff : undefined;
    if (decision.jobId && standing?.jobId !== decision.jobId) {
      await cancelJob(topology, decision.jobId).catch((err: unknown) =>
        ctx.log.warn({ err, jobId: decision.jobId }, "could not cancel a handoff's job another dispatcher's decision left out"),
      );
    }
    return;
  }
  ctx.log.info({ jobId: job.id, to: decision.to, next: decision.jobId, refused: decision.error?.message }, "handoff decided");
}

/** The chain a job starts when it first hands off. */
function rootLink(job: JobRecord): ChainLink {
  const limits = job.spec?.chainLimits ?? DEFAULT_CHAIN_LIMITS;
  return {
    root: job.id,
    depth: 0,
    history: [],
    limits,
    ...(limits.deadline !== undefined ? { deadline: new Date(Date.parse(job.createdAt) + limits.deadline).toISOString() } : {}),
  };
}

/** Refuses a handoff the agent did not declare, or one past a chain limit or a finished run. */
async function checkHandoff(
  topology: Topology,
  job: JobRecord,
  request: HandoffRequest,
  link: ChainLink,
  from: AgentDefinition | undefined,
): Promise<void> {
  const refuse = (message: string) => {
    throw new BoxcarError(ErrorCode.handoffRefused, message, { issues: [{ path: "handoff.to", message }] });
  };
  if (!from?.handoffs.includes(request.to)) {
    const declared = from?.handoffs.length ? from.handoffs.join(", ") : "none";
    refuse(
      `agent ${job.agent} may not hand off to ${request.to}: its declared handoffs are ${declared}; add ${request.to} to its handoffs`,
    );
  }
  if (request.stayInSession && job.spec?.session === undefined) {
    refuse(`job ${job.id} ran in no session: its handoff to ${request.to} cannot stay in one (stayInSession)`);
  }
  if (link.depth + 1 > link.limits.maxHops) {
    refuse(`the chain reached its limit of ${link.limits.maxHops} handoffs (maxHops); not handing off to ${request.to}`);
  }
  const visits = [...link.history.map((h) => h.agent), job.agent].filter((a) => a === request.to).length;
  if (visits + 1 > link.limits.maxVisits) {
    refuse(`agent ${request.to} already ran ${visits} times in this chain, its limit (maxVisits ${link.limits.maxVisits})`);
  }
  if (link.deadline && Date.parse(link.deadline) <= Date.now()) {
    refuse(`the chain passed its deadline of ${link.deadline}; not handing off to ${request.to}`);
  }
  if (link.run) {
    const run = await getJson(topology.workflows, link.run, WorkflowRun, "workflow run");
    if (run && isRunFinal(run.value.state)) refuse(`workflow run ${link.run} ended ${run.value.state}; not handing off to ${request.to}`);
  }
}

/**
 * The next job: the handoff's input and, unless it says otherwise, this job's output files at the
 * same paths; in this job's session if it asks to stay there. A priority the submitter (or workflow step) chose holds for the whole chain;
 * without one, the next agent's own applies.
 */
function nextSpec(job: JobRecord, request: HandoffRequest): JobSpecInput {
  return {
    agent: request.to,
    input: request.input,
    files: request.carryFiles ? job.artifacts.map((a) => ({ path: a.path, object: a.object })) : [],
    labels: job.spec?.labels ?? {},
    ...(job.spec?.priority ? { priority: job.spec.priority } : {}),
    ...(request.stayInSession && job.spec?.session !== undefined ? { session: job.spec.session } : {}),
  };
}

async function recordDecision(topology: Topology, id: string, decision: HandoffDecision): Promise<JobRecord | undefined> {
  const change = await topology.jobStore.change(id, (job) => JobTransitions.decideHandoff(job, decision));
  return change.written ? change.handle.record : undefined;
}
