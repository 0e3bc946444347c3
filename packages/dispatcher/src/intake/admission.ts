import type { Logger } from "@boxcar/common";
import type { Topology, WorkSigner } from "@boxcar/fabric";
import { DUPLICATE_WINDOW_MS, EventNotStored, getJson, isStorageFull, type JobHandle, nowIso } from "@boxcar/fabric/internal";
import {
  type AgentDefinition,
  BoxcarError,
  type ChainLink,
  ErrorCode,
  type ErrorInfo,
  type Identity,
  isTerminal,
  JobRecord,
  JobSpec,
  ownerOf,
  PROTOCOL_VERSION,
  parseWith,
  type Role,
} from "@boxcar/protocol";
import { checkAgentPolicy, checkInput, JobTransitions, MAX_DELAY_MS, mayAccess, placesOf } from "@boxcar/protocol/internal";
import type { AgentCatalog } from "../catalog/agent-catalog.js";
import type { WorkerDirectory } from "../catalog/worker-directory.js";
import type { DispatcherMetrics } from "../dispatcher-metrics.js";
import { newJobId } from "../jobs/job-id.js";
import { publishWorkItem } from "../jobs/work-items.js";
import type { ConcurrencyLimits } from "../limits/concurrency.js";
import type { JobLoad, PolicyBook } from "../limits/policy.js";
import { reserveFor } from "../limits/rate-limit.js";
import type { UsageLedger } from "../limits/usage-ledger.js";
import type { SessionDesk } from "../sessions/sessions.js";
import { claimKey } from "./idempotency.js";

export interface Admitted {
  job: JobRecord;
  /** True when an earlier submission with the same idempotency key is returned. */
  duplicate: boolean;
}

/** What admitting a job needs besides the topology. */
export interface AdmissionContext {
  log: Logger;
  agents: AgentCatalog;
  workers: WorkerDirectory;
  /** Signs work items, so workers that check signatures run them; absent: items go unsigned. */
  signer?: WorkSigner | undefined;
  /** The admin's policy: every job's agent must conform to it, however the job comes about. */
  policy: PolicyBook;
  /** The jobs waiting and running: quotas, and the room left in the queue for new work. */
  load: JobLoad;
  /** Told when a new job's work item is stored, so the sweep that finishes cut-short admissions leaves it alone. */
  onWorkPublished?(jobId: string): void;
  /** Counts admissions and refusals when the dispatcher serves metrics. */
  metrics?: DispatcherMetrics | undefined;
  /** The sessions: a job that names one runs in it. */
  sessions: SessionDesk;
  /** Agents' concurrency limits: a job of such an agent takes a place, or waits for one. */
  limits: ConcurrencyLimits;
  /** The day's usage per agent and user, against the budgets (set once the usage consumer runs; no budget is checked before). */
  usage?: UsageLedger;
}

/** The session a job runs in: the worker that holds it, and its pool. */
type SessionPlace = Awaited<ReturnType<SessionDesk["forJob"]>>;

/** Who a job is for, and how it comes about other than by a plain submission. */
export interface AdmitOptions {
  /** The user the job belongs to: the caller, or the owner of the chain or run it is part of. */
  owner: string;
  /**
   * The owner's role (as its request, run, chain or schedule has it): the job counts under that
   * role's quota, as every job does however it comes about (admins have none). Absent: a
   * submitter's (an intake message's subject names its owner, not a role).
   */
  ownerRole?: Role | undefined;
  /** Deduplicates a submission that carries no key of its own (an intake redelivery, a handoff, a workflow step). */
  implicitKey?: string;
  /** The job's place in a handoff chain or workflow run; `root` defaults to the job itself. */
  chain?: Pick<ChainLink, "depth" | "history" | "limits"> &
    Partial<Pick<ChainLink, "root" | "parent" | "deadline" | "run" | "step" | "index" | "stepLimits">>;
  /** The trace the job joins (W3C `traceparent`): the submit request's span, or the job that handed off's. */
  traceparent?: string;
  /** The schedule (of `owner`'s) that submits it, and the tick it is submitted for. */
  schedule?: { name: string; tick: string };
  /** The ended job it runs again (`jobs.rerun`). */
  rerunOf?: string;
}

/**
 * Admits one job: validates the spec against the schema and the agent registry, then records it
 * and enqueues its work item. Idempotent per key: a second call with the same key returns the
 * first job and finishes its admission if a crash interrupted it.
 */
export function admit(topology: Topology, raw: unknown, ctx: AdmissionContext, opts: AdmitOptions): Promise<Admitted> {
  const admission = () => admitJob(topology, raw, ctx, opts);
  return ctx.metrics ? ctx.metrics.admission(admission) : admission();
}

async function admitJob(topology: Topology, raw: unknown, ctx: AdmissionContext, opts: AdmitOptions): Promise<Admitted> {
  // New work waits for room in the queue and the store; a job that continues admitted work (a
  // handoff, a workflow step) does not, or the queue could strand what it already holds.
  if (!opts.chain) {
    // What the store holds, at most a second old (on no answer, as last known).
    await ctx.load
      .storeOf(topology)
      .prepare(ctx.policy.policy)
      .catch(() => {});
    ctx.load.checkRoom(ctx.policy.policy);
  }
  const spec = parseWith(JobSpec, raw, "job spec");
  const agent = await ctx.agents.get(spec.agent);
  checkInput(agent, spec.input);
  await ctx.usage?.checkBudgets(ctx.policy.policy, agent.name, opts.owner);
  // The job's own timeout counts as the agent's: a spec may not ask for more time than the policy allows.
  const asRun = spec.timeout === undefined ? agent : { ...agent, runtime: { ...agent.runtime, timeout: spec.timeout } };
  try {
    checkAgentPolicy(asRun, ctx.policy.policy.agents, "the system policy");
  } catch (err) {
    throw inSpecTerms(err, spec);
  }
  // A job in a session runs on the worker that holds it; any other waits for a worker of its pool.
  const session = spec.session === undefined ? undefined : await ctx.sessions.forJob(spec.session, opts.owner, agent);
  if (!session) ctx.workers.checkServable(agent, spec.pool ?? agent.pool);
  // It runs in its session's pool, and counts there (under the pool's concurrency limit, say).
  if (session && spec.pool !== undefined && spec.pool !== session.pool) {
    throw new BoxcarError(ErrorCode.invalid, `a job in session ${session.id} runs in its session's pool, ${session.pool}: leave pool out`, {
      issues: [{ path: "pool", message: `not the session's pool (${session.pool})` }],
    });
  }
  await checkInputFiles(topology, spec);

  // A caller's own key is scoped to its owner: another user's equal key is another job.
  const key = spec.idempotencyKey !== undefined ? `owner:${opts.owner}:${spec.idempotencyKey}` : opts.implicitKey;
  let id = newJobId();
  if (key !== undefined) {
    const claimed = await claimKey(topology.idempotency, key, id).catch(async (err: unknown) => {
      throw isStorageFull(err) ? await noRoom(topology, ctx, id) : err;
    });
    if (claimed !== id) {
      const existing = await getJson(topology.jobs, claimed, JobRecord, "job record");
      if (existing) {
        // A crash may have come between the record and its work item: publish the item again.
        // Within the stream's duplicate window the server drops it if it was already there.
        if (existing.value.state === "queued" && Date.now() - Date.parse(existing.value.createdAt) < DUPLICATE_WINDOW_MS) {
          await publishWorkItem(topology, existing.value, agent, ctx);
        }
        return { job: existing.value, duplicate: true };
      }
      id = claimed; // the key was claimed but the record never written: finish that admission.
    }
  }

  // Counted against its owner's quota from here, before anything is taken for it.
  const role = opts.ownerRole ?? "submitter";
  return ctx.load.counted({ user: opts.owner, role }, id, ctx.policy.policy, () =>
    createJob(topology, ctx, opts, { id, spec, agent, session, role }),
  );
}

/** The rest of an admission, once the job has its id and is counted: its record, its places and its work item. */
async function createJob(
  topology: Topology,
  ctx: AdmissionContext,
  opts: AdmitOptions,
  { id, spec, agent, session, role }: { id: string; spec: JobSpec; agent: AgentDefinition; session: SessionPlace | undefined; role: Role },
): Promise<Admitted> {
  const { log } = ctx;
  const now = nowIso();
  const record: JobRecord = {
    v: PROTOCOL_VERSION,
    id,
    agent: agent.name,
    pool: session?.pool ?? spec.pool ?? agent.pool,
    owner: opts.owner,
    ...(role !== "submitter" ? { role } : {}),
    priority: spec.priority ?? agent.priority ?? "normal",
    state: "queued",
    spec,
    attempt: 0,
    createdAt: now,
    queuedAt: now,
    artifacts: [],
    history: [],
    attemptsAllowed: (spec.retry ?? agent.retry)?.maxAttempts ?? 1,
  };
  if (session) record.session = { id: session.id, workerId: session.workerId };
  if (opts.chain) record.chain = { ...opts.chain, root: opts.chain.root ?? id };
  if (opts.traceparent) record.traceparent = opts.traceparent;
  if (opts.schedule) record.schedule = opts.schedule;
  if (opts.rerunOf) record.rerunOf = opts.rerunOf;
  // A delayed job waits for its time (and reserves its rate limit's turn then), a rate-limited one
  // for its turn; its queue timeout counts from then.
  const asked = startOf(spec, now);
  const turn =
    asked === undefined && agent.rateLimit
      ? await reserveFor(
          ctx.limits.entries,
          agent,
          { spec, owner: opts.owner },
          Date.parse(now),
          spec.deadline === undefined ? undefined : Date.parse(now) + spec.deadline,
        )
      : undefined;
  const runAt = asked ?? (turn !== undefined && turn > Date.parse(now) ? turn : undefined);
  if (runAt !== undefined) record.runAt = new Date(runAt).toISOString();
  if (runAt !== undefined && asked === undefined) record.rateLimited = true;
  // One that may start now takes its places under its concurrency limits, or waits for one; a
  // delayed one does when its time comes (holding a place until then would hold up everyone's).
  const entered = runAt === undefined ? await ctx.limits.enter(agent, { id, spec, owner: opts.owner }, record.pool) : undefined;
  if (entered) record.concurrency = entered.concurrency;
  const queueTimeout = spec.queueTimeout ?? agent.runtime.queueTimeout;
  if (queueTimeout !== undefined) record.expiresAt = new Date((runAt ?? Date.parse(now)) + queueTimeout).toISOString();
  if (spec.deadline !== undefined) record.deadlineAt = new Date(Date.parse(now) + spec.deadline).toISOString();
  // The record and its event (`accepted` folded into `queued`), stored before the work item so
  // that the event precedes anything a worker publishes.
  const admitted = await topology.jobStore.create(JobTransitions.admit(record)).catch(async (err: unknown) => {
    if (err instanceof EventNotStored) return err; // the record is written: taken back below if the store is full
    await ctx.limits.leave(entered?.taken ?? [], id).catch(() => {}); // else the sweep frees them
    throw isStorageFull(err) ? await noRoom(topology, ctx, id) : err;
  });
  if (!admitted) {
    // (The places its twin took, with one job id, are the twin's: they stay.)
    // Two submissions with one key raced past the key's claim: the other one wrote the record.
    const other = await topology.jobStore.read(id);
    if (!other) throw new BoxcarError(ErrorCode.conflict, `job ${id} was written and removed while it was being admitted`);
    return { job: other.record, duplicate: true };
  }
  const created = admitted instanceof EventNotStored ? admitted.handle : admitted;
  // Counted at once, not when the watch brings it: a burst cannot pass the queue limit (or the headroom) unseen.
  const recordBytes = Buffer.byteLength(JSON.stringify(record));
  ctx.load.observe(id, record, recordBytes);
  ctx.load.storeOf(topology).wrote(recordBytes);
  try {
    if (admitted instanceof EventNotStored) throw admitted;
    await publishWorkItem(topology, record, agent, ctx);
  } catch (err) {
    if (!isStorageFull(err)) throw err;
    // The record without its work item would be a job half-admitted: take it back (on a full
    // store too: see `withdraw`). Only if that fails is the job kept, and the caller told so
    // with a code of its own: it runs once space frees, so it must not be submitted again.
    const removed = await topology.jobStore.withdraw(created).catch((removeErr: unknown) => {
      log.error({ err: removeErr, jobId: id }, "a job refused for want of storage could not be removed; it runs once space frees");
      return false;
    });
    if (!removed) throw new JobKeptError(record);
    log.warn({ jobId: id }, "job taken back: JetStream's store filled while it was admitted");
    ctx.load.observe(id, undefined);
    if (record.concurrency) await ctx.limits.leave(placesOf(record.concurrency), id);
    throw await noRoom(topology, ctx, id);
  }
  ctx.onWorkPublished?.(id);
  log.info(
    {
      jobId: id,
      agent: agent.name,
      pool: record.pool,
      priority: record.priority,
      ...(record.chain ? { run: record.chain.run, depth: record.chain.depth } : {}),
    },
    "job queued",
  );
  return { job: record, duplicate: false };
}

/** When a delayed job may start (ms since the epoch), or undefined for one that may start now; a `runAt` past the bound is refused. */
function startOf(spec: JobSpec, now: string): number | undefined {
  const at = spec.runAt !== undefined ? Date.parse(spec.runAt) : spec.delay !== undefined ? Date.parse(now) + spec.delay : undefined;
  if (at === undefined || at <= Date.parse(now)) return undefined;
  if (at - Date.parse(now) > MAX_DELAY_MS) {
    throw new BoxcarError(ErrorCode.invalid, `runAt ${spec.runAt} is more than 30 days ahead`, {
      issues: [{ path: "runAt", message: "at most 30 days ahead" }],
    });
  }
  // A job that could only end `timed_out` at its time is refused now.
  if (spec.deadline !== undefined && at - Date.parse(now) >= spec.deadline) {
    throw new BoxcarError(ErrorCode.invalid, "the job's deadline passes before its time comes: give it a longer deadline, or none", {
      issues: [{ path: "deadline", message: "shorter than the delay" }],
    });
  }
  return at;
}

/**
 * Records a submission that cannot be admitted as a `rejected` job with the reason, so a
 * fire-and-forget submitter can find out why. Nothing is enqueued.
 */
export async function recordRejection(
  topology: Topology,
  agentName: string,
  owner: string,
  error: ErrorInfo,
  key: string,
  /** What else the record says of where the submission came from (the schedule and its tick). */
  from: Pick<JobRecord, "schedule"> = {},
): Promise<JobRecord> {
  const id = await claimKey(topology.idempotency, key, newJobId());
  const existing = await topology.jobStore.read(id);
  if (existing) return existing.record;
  const now = nowIso();
  const record: JobRecord = {
    v: PROTOCOL_VERSION,
    id,
    agent: agentName,
    pool: "default",
    owner,
    state: "rejected",
    attempt: 0,
    createdAt: now,
    finishedAt: now,
    artifacts: [],
    history: [],
    error,
    ...from,
  };
  // Raced by the other submission with this key: its record stands.
  if (!(await topology.jobStore.create(JobTransitions.admit(record)))) return (await topology.jobStore.read(id))?.record ?? record;
  return record;
}

/**
 * A submission refused because JetStream's store is full, of which nothing was kept. The store
 * holds all it can: the dispatcher learns its size from that (`StoreRoom`), for the headroom.
 */
async function noRoom(topology: Topology, ctx: Pick<AdmissionContext, "load">, id: string): Promise<BoxcarError> {
  await ctx.load.storeOf(topology).noteFull();
  return new BoxcarError(
    ErrorCode.storageFull,
    `no room in JetStream for job ${id}: its store is full (the server's max_file_store or the account's limit); nothing was kept. ` +
      "Submit again once queued jobs have run or space is freed (with an idempotency key a retry cannot make two jobs)",
  );
}

/**
 * A submission the store filled under whose record could not be taken back (`accepted_pending`):
 * the job is kept, queued, and runs once space frees (the admission sweep publishes its work item).
 */
export class JobKeptError extends BoxcarError {
  constructor(readonly job: JobRecord) {
    super(
      ErrorCode.acceptedPending,
      `job ${job.id} is kept and runs once space frees: JetStream's store filled before its work item was stored, and its record could not be taken back. ` +
        "Do not submit it again (with its idempotency key, a resubmission returns this job); follow it with boxcar status",
    );
  }
}

/**
 * `admit` for work the system continues itself (a handoff's next job, a workflow step's, a
 * schedule's tick): a job the store kept though it filled (`JobKeptError`) is admitted as far
 * as they are concerned. It runs once space frees, and an admission under its key returns it
 * again; taken for a refusal, it would run all the same, unknown to its chain, run or schedule.
 */
export async function admitContinued(topology: Topology, raw: unknown, ctx: AdmissionContext, opts: AdmitOptions): Promise<Admitted> {
  try {
    return await admit(topology, raw, ctx, opts);
  } catch (err) {
    if (err instanceof JobKeptError) return { job: err.job, duplicate: false };
    throw err;
  }
}

async function checkInputFiles(topology: Topology, spec: JobSpec): Promise<void> {
  const seen = new Set<string>();
  for (const [i, file] of spec.files.entries()) {
    if (seen.has(file.path)) {
      throw new BoxcarError(ErrorCode.invalid, `two input files have the path ${file.path}`, {
        issues: [{ path: `files[${i}].path`, message: "duplicate path" }],
      });
    }
    seen.add(file.path);
    const info = await topology.artifacts.info(file.object);
    if (!info || info.deleted) {
      throw new BoxcarError(
        ErrorCode.inputFileMissing,
        `input file ${file.path}: no object ${JSON.stringify(file.object)} in the Object Store`,
        {
          issues: [{ path: `files[${i}].object`, message: "no such object" }],
        },
      );
    }
  }
}

/**
 * A policy refusal of the agent a spec runs, with paths into the spec (an issue's path is
 * relative to the request): the spec's own `timeout` where it asked for too much, else the
 * whole body, naming the agent's field in the message (the agent was applied before the policy).
 */
function inSpecTerms(err: unknown, spec: JobSpec): unknown {
  if (!(err instanceof BoxcarError)) return err;
  const issues = err.issues.map((issue) =>
    issue.path === "runtime.timeout" && spec.timeout !== undefined
      ? { ...issue, path: "timeout" }
      : { ...issue, path: "", message: `agent ${spec.agent}'s ${issue.path}: ${issue.message}` },
  );
  return new BoxcarError(err.code, err.message, { issues, cause: err.cause });
}

/**
 * Runs an ended job's spec again as a new job (`jobs.rerun`), with `input` in place of its input
 * when given: the new job names the old (`rerunOf`), the old is left as it is. It belongs to the
 * old job's owner and counts as any new job (queue room, quotas, budgets, its agent's input
 * schema); its delay and idempotency key are not carried.
 */
export async function rerunJob(
  topology: Topology,
  request: { id: string; input?: unknown },
  caller: Identity,
  ctx: AdmissionContext,
): Promise<Admitted> {
  const found = await topology.jobStore.read(request.id);
  if (!found || !mayAccess(caller, ownerOf(found.record))) throw new BoxcarError(ErrorCode.notFound, `no job ${request.id}`);
  const old = found.record;
  if (!isTerminal(old.state)) throw new BoxcarError(ErrorCode.conflict, `job ${old.id} is ${old.state}: a job is re-run once it has ended`);
  if (!old.spec) throw new BoxcarError(ErrorCode.conflict, `job ${old.id} keeps no spec to run again`);
  const { idempotencyKey: _key, runAt: _runAt, delay: _delay, ...spec } = old.spec;
  return admit(topology, { ...spec, ...(request.input !== undefined ? { input: request.input } : {}) }, ctx, {
    owner: ownerOf(old),
    ownerRole: old.role,
    rerunOf: old.id,
  });
}

/**
 * Runs an ended job again (`jobs.retry`: dead, failed, timed out or cancelled): it goes back to
 * the queue with a fresh budget of attempts (its retry policy's maxAttempts), its history kept
 * (`JobTransitions.requeueEnded` says which can); a job of a session, only while its session is open.
 */
export async function retryJob(
  topology: Topology,
  id: string,
  caller: Identity,
  ctx: Pick<AdmissionContext, "agents" | "signer" | "workers" | "sessions" | "limits" | "load" | "policy">,
): Promise<JobRecord> {
  const found = await topology.jobStore.read(id);
  if (!found || !mayAccess(caller, ownerOf(found.record))) throw new BoxcarError(ErrorCode.notFound, `no job ${id}`);
  const job = found.record;
  // Refused before anything is counted or taken for it: a job that may not be retried, or one
  // whose input files are gone (deleted with another ended job that shared them, or with this
  // one, by a deletion under way), which would only fail again.
  JobTransitions.requeueEnded(job, 1, nowIso());
  if (job.spec) await checkInputFiles(topology, job.spec);
  // An ended job waits again: it counts against its owner's quota as a new job would (an admin's retry of it too).
  return ctx.load.counted({ user: ownerOf(job), role: job.role ?? "submitter" }, id, ctx.policy.policy, () =>
    requeueEnded(topology, found, ctx),
  );
}

async function requeueEnded(
  topology: Topology,
  found: JobHandle,
  ctx: Pick<AdmissionContext, "agents" | "signer" | "workers" | "sessions" | "limits">,
): Promise<JobRecord> {
  const job = found.record;
  const id = job.id;
  const agent = await ctx.agents.get(job.agent);
  // A job of a session runs there again only while the session is open, on the worker that holds it.
  if (job.session) await ctx.sessions.forJob(job.session.id, ownerOf(job), agent);
  const retry = job.spec?.retry ?? agent.retry;
  // It takes its places under its concurrency limits again, or waits for one (a place taken for
  // it that a racing retry leaves unused is the sweep's to free or finish).
  const place = job.spec ? await ctx.limits.enter(agent, { id, spec: job.spec, owner: ownerOf(job) }, job.pool) : undefined;
  const change = await topology.jobStore.change(found, (current) =>
    JobTransitions.requeueEnded(current, retry?.maxAttempts ?? 1, nowIso(), place?.concurrency),
  );
  if (!change.written) throw new BoxcarError(ErrorCode.notFound, `no job ${id}`);
  const next = change.handle.record;
  await publishWorkItem(topology, next, agent, ctx, `${id}:retry:${job.attempt}`);
  return next;
}
