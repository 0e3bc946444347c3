import { getJson, type Logger, listJson, type Topology } from "@boxcar/client";
import {
  AgentDefinition,
  AgentRef,
  ApiEndpoint,
  ApplyAgentRequest,
  BoxcarError,
  decodeMessage,
  ErrorCode,
  JobRef,
  MAX_SPEC_BYTES,
  parseWith,
  RunRef,
  toErrorInfo,
  WorkerInfo,
} from "@boxcar/protocol";
import type { ServiceMsg } from "@nats-io/services";
import { z } from "zod";
import { admit, getRecord } from "./admission.js";
import { cancelJob, listJobs, retryJob } from "./jobs.js";
import type { WorkerDirectory } from "./worker-directory.js";
import type { Runs } from "./workflows/runs.js";

type Handler = (body: unknown) => Promise<unknown>;

/** HTTP-like status for the services API error header; the body carries the stable code. */
const STATUS: Partial<Record<string, number>> = {
  [ErrorCode.badJson]: 400,
  [ErrorCode.invalid]: 400,
  [ErrorCode.unknownAgent]: 404,
  [ErrorCode.notFound]: 404,
  [ErrorCode.inputFileMissing]: 404,
  [ErrorCode.conflict]: 409,
  [ErrorCode.tooLarge]: 413,
  [ErrorCode.noSandbox]: 422,
  [ErrorCode.handoffRefused]: 422,
};

export function apiHandlers(topology: Topology, log: Logger, workers: WorkerDirectory, runs: Runs): Record<ApiEndpoint, Handler> {
  return {
    [ApiEndpoint.jobsSubmit]: (body) => admit(topology, body, { log, workers }),
    [ApiEndpoint.jobsGet]: async (body) => ({ job: await getRecord(topology, parseWith(JobRef, body, "request").id) }),
    [ApiEndpoint.jobsList]: (body) => listJobs(topology, body),
    [ApiEndpoint.jobsCancel]: async (body) => ({ job: await cancelJob(topology, parseWith(JobRef, body, "request").id) }),
    [ApiEndpoint.jobsRetry]: async (body) => ({ job: await retryJob(topology, parseWith(JobRef, body, "request").id) }),
    [ApiEndpoint.agentsApply]: async (body) => {
      const agent = parseWith(AgentDefinition, parseWith(ApplyAgentRequest, body, "request").definition, "agent definition");
      const previous = await topology.agents.get(agent.name);
      await topology.agents.put(agent.name, JSON.stringify(agent));
      log.info({ agent: agent.name }, "agent applied");
      return { agent, created: previous?.operation !== "PUT" };
    },
    [ApiEndpoint.agentsGet]: async (body) => ({ agent: await getAgent(topology, parseWith(AgentRef, body, "request").name) }),
    [ApiEndpoint.agentsList]: async (body) => {
      parseWith(z.strictObject({}), body, "request");
      return { agents: await listJson(topology.agents, AgentDefinition, "agent") };
    },
    [ApiEndpoint.agentsRemove]: async (body) => {
      const { name } = parseWith(AgentRef, body, "request");
      const agent = await getAgent(topology, name);
      await topology.agents.delete(name);
      log.info({ agent: name }, "agent removed");
      return { agent };
    },
    [ApiEndpoint.workersList]: async (body) => {
      parseWith(z.strictObject({}), body, "request");
      return { workers: await listJson(topology.workers, WorkerInfo, "worker") };
    },
    [ApiEndpoint.workflowsStart]: (body) => runs.start(body),
    [ApiEndpoint.workflowsGet]: async (body) => ({ run: await runs.require(parseWith(RunRef, body, "request").id) }),
    [ApiEndpoint.workflowsList]: (body) => runs.list(body),
    [ApiEndpoint.workflowsCancel]: async (body) => ({ run: await runs.cancel(parseWith(RunRef, body, "request").id) }),
  };
}

async function getAgent(topology: Topology, name: string): Promise<AgentDefinition> {
  const found = await getJson(topology.agents, name, AgentDefinition, "agent");
  if (!found) throw new BoxcarError(ErrorCode.notFound, `no agent named ${JSON.stringify(name)}`);
  return found.value;
}

/** Decodes a request, runs its handler and replies `{ ok, data }` or `{ ok: false, error }`. */
export async function serve(handler: Handler, msg: ServiceMsg, log: Logger): Promise<void> {
  try {
    const body = msg.data.byteLength === 0 ? {} : decodeMessage(z.unknown(), msg.data, "request", MAX_SPEC_BYTES);
    const data = await handler(body);
    msg.respond(JSON.stringify({ ok: true, data }));
  } catch (err) {
    const error = toErrorInfo(err);
    if (error.code === ErrorCode.internal) log.error({ err, subject: msg.subject }, "request failed");
    else log.debug({ subject: msg.subject, code: error.code }, "request refused");
    msg.respondError(STATUS[error.code] ?? 500, error.message, JSON.stringify({ ok: false, error }));
  }
}
