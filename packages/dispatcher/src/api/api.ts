import { failSpan, type Logger, NOT_TRACED, SpanKind, startSpan, TRACEPARENT } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { getJson, isTransientJetStreamError, listJson } from "@boxcar/fabric/internal";
import {
  AgentDefinition,
  API_CONTRACT,
  ApiEndpoint,
  type ApiReplyData,
  BoxcarError,
  type CleanJobsRequest,
  ErrorCode,
  type Identity,
  InputFileRef,
  MAX_SPEC_BYTES,
  parseWith,
  READ_ENDPOINTS,
  ROLE_ENDPOINTS,
  toErrorInfo,
  WorkerInfo,
} from "@boxcar/protocol";
import {
  callerOf,
  checkAgentPolicy,
  credentialLikeEnv,
  decodeMessage,
  ERROR_STATUS,
  issuesUnder,
  MAX_SESSION_REQUEST_BYTES,
  mayReplyTo,
  seesAll,
  usageDay,
} from "@boxcar/protocol/internal";
import type { ServiceMsg } from "@nats-io/services";
import { z } from "zod";
import { type AdmissionContext, admit, rerunJob, retryJob } from "../intake/admission.js";
import { artifactChunk, checkInputOwnership, discardUploads, Uploads } from "../jobs/files.js";
import type { JobIndex } from "../jobs/job-index.js";
import { cancelJob, countJobs, getRecord, signalJob } from "../jobs/jobs.js";
import { forgetLimit } from "../limits/rate-limit.js";
import type { UsageLedger } from "../limits/usage-ledger.js";
import type { RetentionSweep } from "../retention/retention.js";
import type { Schedules } from "../schedules/schedules.js";
import type { Runs } from "../workflows/runs.js";
import { eventsPage, jobEvents, jobLogs, logsPage, runEvents } from "./history.js";
import { listJobs } from "./job-list.js";

/** Answers one request; `traceparent` is the trace context of the request's span, to pass on. */
type Handler<E extends ApiEndpoint = ApiEndpoint> = (
  body: unknown,
  caller: Identity,
  traceparent: string | undefined,
) => Promise<ApiReplyData<E>>;

/** One handler per endpoint, each answering with its reply's data as `API_CONTRACT` says. */
type Handlers = { [E in ApiEndpoint]: Handler<E> };

/** A request's body parsed with its endpoint's schema in `API_CONTRACT`; error paths are relative to the body. */
function requestOf<E extends ApiEndpoint>(endpoint: E, body: unknown): z.output<(typeof API_CONTRACT)[E]["request"]> {
  return parseWith(API_CONTRACT[endpoint].request, body, "request") as z.output<(typeof API_CONTRACT)[E]["request"]>;
}

/** What the API answers from besides the topology and the admission context. */
export interface ApiParts {
  runs: Runs;
  schedules: Schedules;
  usage: UsageLedger;
  retention: RetentionSweep;
  /** The job index, and when it holds every record stored when the dispatcher started. */
  jobs: { index: JobIndex; caughtUp: Promise<void> };
}

export function apiHandlers(topology: Topology, ctx: AdmissionContext, { runs, retention, jobs, schedules, usage }: ApiParts): Handlers {
  const { log } = ctx;
  const uploads = new Uploads(topology, log);
  const { sessions } = ctx;
  return {
    [ApiEndpoint.sessionsOpen]: async (body, caller) => ({
      session: await sessions.open(requestOf(ApiEndpoint.sessionsOpen, body), caller),
    }),
    [ApiEndpoint.sessionsExec]: (body, caller) => sessions.exec(requestOf(ApiEndpoint.sessionsExec, body), caller),
    [ApiEndpoint.sessionsStart]: (body, caller) => sessions.start(requestOf(ApiEndpoint.sessionsStart, body), caller),
    [ApiEndpoint.sessionsProcesses]: (body, caller) => sessions.processes(requestOf(ApiEndpoint.sessionsProcesses, body).id, caller),
    [ApiEndpoint.sessionsWait]: (body, caller) => sessions.wait(requestOf(ApiEndpoint.sessionsWait, body), caller),
    [ApiEndpoint.sessionsOutput]: (body, caller) => sessions.output(requestOf(ApiEndpoint.sessionsOutput, body), caller),
    [ApiEndpoint.sessionsKill]: (body, caller) => sessions.kill(requestOf(ApiEndpoint.sessionsKill, body), caller),
    [ApiEndpoint.sessionsInput]: (body, caller) => sessions.input(requestOf(ApiEndpoint.sessionsInput, body), caller),
    [ApiEndpoint.sessionsWatch]: (body, caller) => sessions.watch(requestOf(ApiEndpoint.sessionsWatch, body), caller),
    [ApiEndpoint.sessionsUnwatch]: (body, caller) => sessions.unwatch(requestOf(ApiEndpoint.sessionsUnwatch, body), caller),
    [ApiEndpoint.sessionsConnect]: (body, caller) => sessions.connect(requestOf(ApiEndpoint.sessionsConnect, body), caller),
    [ApiEndpoint.sessionsShell]: (body, caller) => sessions.shell(requestOf(ApiEndpoint.sessionsShell, body), caller),
    [ApiEndpoint.sessionsClose]: async (body, caller) => ({
      session: await sessions.close(requestOf(ApiEndpoint.sessionsClose, body).id, caller),
    }),
    [ApiEndpoint.sessionsSnapshot]: async (body, caller) => ({
      snapshot: await sessions.takeSnapshot(requestOf(ApiEndpoint.sessionsSnapshot, body).id, caller),
    }),
    [ApiEndpoint.snapshotsList]: async (_body, caller) => ({ snapshots: await sessions.snapshots(caller) }),
    [ApiEndpoint.schedulesCreate]: async (body, caller) => {
      // As a submit of its job is: only an admin chooses its pool.
      const { definition } = requestOf(ApiEndpoint.schedulesCreate, body);
      onlyAdminsChoosePools(caller, [(body as { definition?: { job?: unknown } }).definition?.job]);
      return { schedule: await schedules.create(definition, caller) };
    },
    [ApiEndpoint.schedulesUpdate]: async (body, caller) => {
      const { definition } = requestOf(ApiEndpoint.schedulesUpdate, body);
      onlyAdminsChoosePools(caller, [(body as { definition?: { job?: unknown } }).definition?.job]);
      return { schedule: await schedules.update(definition, caller) };
    },
    [ApiEndpoint.schedulesGet]: async (body, caller) => ({
      schedule: await schedules.get(requestOf(ApiEndpoint.schedulesGet, body), caller),
    }),
    [ApiEndpoint.usageGet]: (body, caller) => usage.report(requestOf(ApiEndpoint.usageGet, body).day ?? usageDay(Date.now()), caller),
    [ApiEndpoint.schedulesList]: async (_body, caller) => ({ schedules: await schedules.list(caller) }),
    [ApiEndpoint.schedulesPause]: async (body, caller) => ({
      schedule: await schedules.setPaused(requestOf(ApiEndpoint.schedulesPause, body), caller, true),
    }),
    [ApiEndpoint.schedulesResume]: async (body, caller) => ({
      schedule: await schedules.setPaused(requestOf(ApiEndpoint.schedulesResume, body), caller, false),
    }),
    [ApiEndpoint.schedulesDelete]: async (body, caller) => ({
      schedule: await schedules.remove(requestOf(ApiEndpoint.schedulesDelete, body), caller),
    }),
    [ApiEndpoint.snapshotsRemove]: async (body, caller) => ({
      snapshot: await sessions.removeSnapshot(requestOf(ApiEndpoint.snapshotsRemove, body).id, caller),
    }),
    [ApiEndpoint.sessionsPause]: async (body, caller) => ({
      session: await sessions.pause(requestOf(ApiEndpoint.sessionsPause, body), caller),
    }),
    [ApiEndpoint.sessionsResume]: async (body, caller) => ({
      session: await sessions.resume(requestOf(ApiEndpoint.sessionsResume, body).id, caller),
    }),
    [ApiEndpoint.sessionsCancel]: async (body, caller) => ({
      session: await sessions.cancel(requestOf(ApiEndpoint.sessionsCancel, body).id, caller),
    }),
    [ApiEndpoint.sessionsFilesRead]: (body, caller) =>
      sessions.files(ApiEndpoint.sessionsFilesRead, requestOf(ApiEndpoint.sessionsFilesRead, body), caller),
    [ApiEndpoint.sessionsFilesWrite]: (body, caller) =>
      sessions.files(ApiEndpoint.sessionsFilesWrite, requestOf(ApiEndpoint.sessionsFilesWrite, body), caller),
    [ApiEndpoint.sessionsFilesList]: (body, caller) =>
      sessions.files(ApiEndpoint.sessionsFilesList, requestOf(ApiEndpoint.sessionsFilesList, body), caller),
    [ApiEndpoint.sessionsFilesRemove]: (body, caller) =>
      sessions.files(ApiEndpoint.sessionsFilesRemove, requestOf(ApiEndpoint.sessionsFilesRemove, body), caller),
    [ApiEndpoint.sessionsFilesStat]: (body, caller) =>
      sessions.files(ApiEndpoint.sessionsFilesStat, requestOf(ApiEndpoint.sessionsFilesStat, body), caller),
    [ApiEndpoint.sessionsGet]: async (body, caller) => ({
      session: await sessions.get(requestOf(ApiEndpoint.sessionsGet, body).id, caller),
    }),
    [ApiEndpoint.sessionsList]: async (body, caller) => ({
      sessions: await sessions.list(requestOf(ApiEndpoint.sessionsList, body), caller),
    }),
    [ApiEndpoint.sessionsEvents]: async (body, caller) => {
      const { id, after } = requestOf(ApiEndpoint.sessionsEvents, body);
      const session = await sessions.get(id, caller);
      return eventsPage(topology, topology.names.subjects.event("session", id, "*", session.owner), after);
    },
    [ApiEndpoint.sessionsLogs]: async (body, caller) => {
      const { id, after } = requestOf(ApiEndpoint.sessionsLogs, body);
      const session = await sessions.get(id, caller);
      return logsPage(topology, topology.names.subjects.jobLogs(session.owner, id), after);
    },
    [ApiEndpoint.jobsSubmit]: async (body, caller, traceparent) => {
      onlyAdminsChoosePools(caller, [body]);
      const files = inputFiles(body);
      checkInputOwnership(files, caller);
      try {
        const reply = await admit(topology, body, ctx, {
          owner: caller.user,
          ownerRole: caller.role,
          ...(traceparent ? { traceparent } : {}),
        });
        // An earlier job for the same key was returned: the files sent for this one are not used.
        if (reply.duplicate) {
          const used = new Set(reply.job.spec?.files.map((f) => f.object));
          await discardUploads(
            topology,
            files.filter((f) => !used.has(f.object)),
            caller,
            log,
          );
        }
        return reply;
      } catch (err) {
        if (err instanceof BoxcarError && err.code !== ErrorCode.internal) await discardUploads(topology, files, caller, log);
        throw err;
      }
    },
    [ApiEndpoint.jobsGet]: async (body, caller) => ({ job: await getRecord(topology, requestOf(ApiEndpoint.jobsGet, body).id, caller) }),
    [ApiEndpoint.jobsList]: (body, caller) => listJobs(topology, jobs, body, caller, log),
    [ApiEndpoint.jobsCount]: (body, caller) => countJobs(jobs, body, caller),
    [ApiEndpoint.jobsCancel]: async (body, caller) => {
      const job = await cancelJob(topology, requestOf(ApiEndpoint.jobsCancel, body).id, caller);
      ctx.metrics?.jobAction("cancel", job.agent);
      return { job };
    },
    [ApiEndpoint.jobsRerun]: async (body, caller) => {
      const { job } = await rerunJob(topology, requestOf(ApiEndpoint.jobsRerun, body), caller, ctx);
      ctx.metrics?.jobAction("rerun", job.agent);
      return { job };
    },
    [ApiEndpoint.jobsRetry]: async (body, caller) => {
      const job = await retryJob(topology, requestOf(ApiEndpoint.jobsRetry, body).id, caller, ctx);
      ctx.metrics?.jobAction("retry", job.agent);
      return { job };
    },
    // Admins only (ROLE_ENDPOINTS): it deletes anyone's ended jobs.
    [ApiEndpoint.jobsClean]: (body) => retention.clean(body as CleanJobsRequest),
    [ApiEndpoint.agentsApply]: async (body) => {
      const agent = requestOf(ApiEndpoint.agentsApply, body).definition;
      try {
        checkAgentPolicy(agent, ctx.policy.policy.agents, "the system policy");
        const credentials = credentialLikeEnv(agent.env);
        if (credentials.length > 0) {
          throw new BoxcarError(ErrorCode.invalid, `agent ${agent.name}: ${credentials.map((i) => `${i.path} ${i.message}`).join("; ")}`, {
            issues: credentials,
          });
        }
      } catch (err) {
        throw issuesUnder(err, "definition");
      }
      const before = await getAgent(topology, agent.name).catch(() => undefined);
      const created = await ctx.agents.apply(agent);
      // A new limit starts afresh (as does an agent made again under an old name).
      if ((before?.rateLimit || agent.rateLimit) && JSON.stringify(before?.rateLimit) !== JSON.stringify(agent.rateLimit)) {
        await forgetLimit(topology, agent.name);
      }
      log.info({ agent: agent.name }, "agent applied");
      return { agent, created };
    },
    [ApiEndpoint.agentsGet]: async (body) => ({ agent: await getAgent(topology, requestOf(ApiEndpoint.agentsGet, body).name) }),
    [ApiEndpoint.agentsList]: async (body) => {
      requestOf(ApiEndpoint.agentsList, body);
      return { agents: await listJson(topology.agents, AgentDefinition, "agent") };
    },
    [ApiEndpoint.agentsRemove]: async (body) => {
      const { name } = requestOf(ApiEndpoint.agentsRemove, body);
      const agent = await getAgent(topology, name);
      await ctx.agents.remove(name);
      if (agent.rateLimit) await forgetLimit(topology, name);
      log.info({ agent: name }, "agent removed");
      return { agent };
    },
    [ApiEndpoint.workersList]: async (body, caller) => {
      requestOf(ApiEndpoint.workersList, body);
      const workers = await listJson(topology.workers, WorkerInfo, "worker");
      // The jobs a worker runs are anyone's: a caller who sees only its own gets their count (load).
      return { workers: seesAll(caller.role) ? workers : workers.map((w) => ({ ...w, jobs: [] })) };
    },
    [ApiEndpoint.workflowsStart]: (body, caller, traceparent) => {
      const steps = (body as { workflow?: { steps?: unknown } } | null)?.workflow?.steps;
      onlyAdminsChoosePools(caller, Array.isArray(steps) ? steps : []);
      ctx.load.checkRoom(ctx.policy.policy);
      return runs.start(body, caller, traceparent);
    },
    [ApiEndpoint.workflowsGet]: async (body, caller) => ({ run: await runs.read(requestOf(ApiEndpoint.workflowsGet, body).id, caller) }),
    [ApiEndpoint.workflowsList]: (body, caller) => runs.list(body, caller),
    [ApiEndpoint.workflowsSignal]: (body, caller) => runs.signal(requestOf(ApiEndpoint.workflowsSignal, body), caller),
    [ApiEndpoint.jobsSignal]: (body, caller) => signalJob(topology, requestOf(ApiEndpoint.jobsSignal, body), caller),
    [ApiEndpoint.workflowsApprove]: async (body, caller) => ({
      run: await runs.decide(requestOf(ApiEndpoint.workflowsApprove, body), caller),
    }),
    [ApiEndpoint.workflowsCancel]: async (body, caller) => {
      return { run: await runs.cancel(requestOf(ApiEndpoint.workflowsCancel, body).id, caller) };
    },
    [ApiEndpoint.jobsEvents]: (body, caller) => jobEvents(topology, body, caller),
    [ApiEndpoint.jobsLogs]: (body, caller) => jobLogs(topology, body, caller),
    [ApiEndpoint.jobsArtifact]: (body, caller) => artifactChunk(topology, body, caller),
    [ApiEndpoint.workflowsEvents]: (body, caller) => runEvents(topology, runs, body, caller),
    [ApiEndpoint.inputsUpload]: async (body, caller) => uploads.start(body, caller),
    [ApiEndpoint.policyGet]: async (body) => {
      requestOf(ApiEndpoint.policyGet, body);
      return { policy: ctx.policy.policy };
    },
    [ApiEndpoint.policySet]: (body) => ctx.policy.set(body),
  };
}

/** The input files a job spec names, as far as they are well formed (admission checks the rest). */
function inputFiles(body: unknown): InputFileRef[] {
  const files = (body as { files?: unknown } | null)?.files;
  return Array.isArray(files) ? files.filter((f): f is InputFileRef => InputFileRef.safeParse(f).success) : [];
}

/**
 * A job's pool decides which workers run it, and so which of their secrets and networks it
 * reaches: an admin chooses it, in the agent's definition. Others may not send a job or a
 * workflow step to another pool.
 */
function onlyAdminsChoosePools(caller: Identity, specs: readonly unknown[]): void {
  if (caller.role === "admin") return;
  const chosen = specs.some((spec) => spec !== null && typeof spec === "object" && "pool" in spec);
  if (chosen) {
    throw new BoxcarError(ErrorCode.forbidden, `only an admin chooses a job's pool; the ${caller.role} role uses the agent's own`, {
      issues: [{ path: "pool", message: "not allowed for this role" }],
    });
  }
}

export async function getAgent(topology: Topology, name: string): Promise<AgentDefinition> {
  const found = await getJson(topology.agents, name, AgentDefinition, "agent");
  if (!found) throw new BoxcarError(ErrorCode.notFound, `no agent named ${JSON.stringify(name)}`);
  return found.value;
}

/**
 * Decodes a request, checks that its caller's role may make it, runs its handler and replies
 * `{ ok, data }` or `{ ok: false, error }`. The caller is read from the subject, where NATS
 * permissions put it (see `access.ts`). A request whose reply subject is not one of its caller's
 * inboxes is dropped unanswered and unrun: a dispatcher may publish to records, events and
 * control subjects, so an answer sent where a caller says could overwrite or cancel anything.
 */
const READ_ONLY: ReadonlySet<ApiEndpoint> = new Set(READ_ENDPOINTS);
/** The endpoints whose requests carry a file's part, or a command's stdin, in base64: up to `MAX_SESSION_REQUEST_BYTES`. */
const LARGE_REQUESTS: ReadonlySet<ApiEndpoint> = new Set([
  ApiEndpoint.sessionsFilesWrite,
  ApiEndpoint.sessionsExec,
  ApiEndpoint.sessionsStart,
]);

export async function serve(topology: Topology, endpoint: ApiEndpoint, handler: Handler, msg: ServiceMsg, log: Logger): Promise<void> {
  const caller = callerOf(topology.names, msg.subject);
  // Only an admin may publish on a subject that names no caller (see `access.ts`).
  const replyOk = caller ? mayReplyTo(topology.names, caller, msg.reply) : msg.reply?.startsWith("_INBOX.") === true;
  if (!replyOk) {
    log.warn({ subject: msg.subject, reply: msg.reply }, "request dropped: its reply subject is not one of its caller's inboxes");
    return;
  }
  // A span for the request, joining the caller's trace when its request carries one. A read
  // begins no trace of its own (a follower's polling, a dashboard's reloads): it is traced only
  // as part of a caller's trace.
  const parent = msg.headers?.get(TRACEPARENT) || undefined;
  const { span, traceparent } =
    parent === undefined && READ_ONLY.has(endpoint)
      ? { span: NOT_TRACED, traceparent: undefined }
      : startSpan(endpoint, parent, {
          kind: SpanKind.SERVER,
          attributes: {
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.destination.name": msg.subject,
            ...(caller ? { "boxcar.caller.role": caller.role, "boxcar.caller.user": caller.user } : {}),
          },
        });
  try {
    if (!caller) throw new BoxcarError(ErrorCode.invalid, `${msg.subject} is not <prefix>.api.<role>.<user>.<endpoint>`);
    if (!ROLE_ENDPOINTS[caller.role].includes(endpoint)) {
      throw new BoxcarError(ErrorCode.forbidden, `the ${caller.role} role may not call ${endpoint}`);
    }
    const limit = LARGE_REQUESTS.has(endpoint) ? MAX_SESSION_REQUEST_BYTES : MAX_SPEC_BYTES;
    const body = msg.data.byteLength === 0 ? {} : decodeMessage(z.unknown(), msg.data, "request", limit);
    const data = await handler(body, caller, traceparent);
    const named = data as { job?: { id?: unknown }; run?: { id?: unknown } } | undefined;
    if (typeof named?.job?.id === "string") span.setAttribute("boxcar.job.id", named.job.id);
    if (typeof named?.run?.id === "string") span.setAttribute("boxcar.run.id", named.run.id);
    msg.respond(JSON.stringify({ ok: true, data }));
  } catch (err) {
    // JetStream not answering (a cluster electing leaders) is worth asking again, not a fault.
    const error = isTransientJetStreamError(err)
      ? { code: ErrorCode.unavailable, message: `JetStream did not answer in time (${(err as Error).message}): try again` }
      : toErrorInfo(err);
    if (error.code === ErrorCode.internal) log.error({ err, subject: msg.subject }, "request failed");
    else log.debug({ subject: msg.subject, code: error.code }, "request refused");
    failSpan(span, error);
    msg.respondError(ERROR_STATUS[error.code as ErrorCode] ?? 500, error.message, JSON.stringify({ ok: false, error }));
  } finally {
    span.end();
  }
}
