import { createWriteStream } from "node:fs";
import { mkdir, open } from "node:fs/promises";
import { dirname, join, resolve, sep } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import {
  type AgentDefinition,
  ApiEndpoint,
  ApiReply,
  ApplyAgentReply,
  BoxcarError,
  BoxcarEvent,
  CancelReply,
  ErrorCode,
  type Identity,
  type InputFileRef,
  isTerminal,
  type JobRecord,
  type JobSpecInput,
  ListAgentsReply,
  ListJobsReply,
  type ListJobsRequest,
  ListRunsReply,
  type ListRunsRequest,
  ListWorkersReply,
  type LogStream,
  OPEN_IDENTITY,
  ownerOf,
  parseWith,
  RunReply,
  StartRunReply,
  type StartRunRequest,
  SubmitReply,
  type WorkerInfo,
  type WorkflowRun,
} from "@boxcar/protocol";
import type { JsMsg } from "@nats-io/jetstream";
import { errors as natsErrors } from "@nats-io/transport-node";
import type { z } from "zod";
import { followChain, followRun, waitForChainEnd, waitForJobRecord, waitForRunEnd } from "./chain-events.js";
import { readStream } from "./stream-reader.js";
import type { Topology } from "./topology.js";

export interface ClientOptions {
  /** How long to wait for a dispatcher's reply; default 10 s. */
  requestTimeoutMs?: number;
  /**
   * Who the client asks as: the role and user of its NATS credential (`connectNats` reads them
   * from it). Default: an admin named `local`, what any caller of a server without
   * authentication is.
   */
  identity?: Identity;
}

export interface LogChunk {
  stream: LogStream;
  data: Uint8Array;
}

/** A local file to put in the job's workspace at `path`. */
export interface LocalInputFile {
  localPath: string;
  path: string;
}

export interface SubmitOptions {
  /**
   * Local files to upload to the Object Store first (claim-check). They are removed again when
   * the submission is refused or returns an earlier job for the same idempotency key.
   */
  upload?: readonly LocalInputFile[];
}

export interface FollowOptions {
  follow?: boolean;
  signal?: AbortSignal;
}

export interface JobEventsOptions extends FollowOptions {
  /** Also the events of the jobs this one hands off to, in chain order. */
  chain?: boolean;
}

/** Submits and watches jobs, manages agents, reads results and artifacts. */
export interface BoxcarClient {
  submit(spec: JobSpecInput, opts?: SubmitOptions): Promise<{ job: JobRecord; duplicate: boolean }>;
  /** Puts a local file in the Object Store and returns the reference a job spec carries. */
  uploadInput(localPath: string, workspacePath: string): Promise<InputFileRef>;
  getJob(id: string): Promise<JobRecord>;
  listJobs(request?: ListJobsRequest): Promise<{ jobs: JobRecord[]; next?: string }>;
  cancelJob(id: string): Promise<JobRecord>;
  /** Runs a dead job again, with a fresh budget of attempts. */
  retryJob(id: string): Promise<JobRecord>;
  /** Resolves with the job's record once it reaches a final state. */
  waitForJob(id: string, signal?: AbortSignal): Promise<JobRecord>;
  /** The job's events in order; with `follow`, until its final event (with `chain`, the chain's). */
  events(jobId: string, opts?: JobEventsOptions): AsyncGenerator<BoxcarEvent>;
  /** Resolves with the last job of the handoff chain `jobId` starts, once the chain has ended. */
  waitForChain(jobId: string, signal?: AbortSignal): Promise<JobRecord>;
  /** Starts a workflow run; `workflow` is a definition as in a workflow file. */
  startRun(request: StartRunRequest): Promise<{ run: WorkflowRun; duplicate: boolean }>;
  getRun(id: string): Promise<WorkflowRun>;
  listRuns(request?: ListRunsRequest): Promise<WorkflowRun[]>;
  cancelRun(id: string): Promise<WorkflowRun>;
  /** Resolves with the run once it has ended and none of its jobs is still going. */
  waitForRun(id: string, signal?: AbortSignal): Promise<WorkflowRun>;
  /** The run's events and its jobs' events in order; with `follow`, until the run has ended. */
  runEvents(runId: string, opts?: FollowOptions): AsyncGenerator<BoxcarEvent>;
  /** The job's output in order; with `follow`, until the job is final and its output is read. */
  logs(jobId: string, opts?: FollowOptions): AsyncGenerator<LogChunk>;
  /** Downloads the job's artifacts under `dir`; returns the paths written. */
  downloadArtifacts(jobId: string, dir: string): Promise<string[]>;
  applyAgent(definition: unknown): Promise<{ agent: AgentDefinition; created: boolean }>;
  getAgent(name: string): Promise<AgentDefinition>;
  listAgents(): Promise<AgentDefinition[]>;
  removeAgent(name: string): Promise<void>;
  listWorkers(): Promise<WorkerInfo[]>;
}

export function createClient(topology: Topology, opts: ClientOptions = {}): BoxcarClient {
  return new Client(topology, opts.requestTimeoutMs ?? 10_000, opts.identity ?? OPEN_IDENTITY);
}

class Client implements BoxcarClient {
  constructor(
    private readonly topology: Topology,
    private readonly timeoutMs: number,
    private readonly identity: Identity,
  ) {}

  private async request<S extends z.ZodType>(endpoint: ApiEndpoint, body: unknown, schema: S): Promise<z.infer<S>> {
    const subject = this.topology.names.subjects.api(this.identity, endpoint);
    let reply: Uint8Array;
    try {
      const msg = await this.topology.nc.request(subject, JSON.stringify(body), { timeout: this.timeoutMs });
      reply = msg.data;
    } catch (err) {
      if (err instanceof natsErrors.NoRespondersError || (err instanceof natsErrors.RequestError && err.isNoResponders())) {
        throw new BoxcarError(ErrorCode.unavailable, `no dispatcher answers on ${subject}: is one running?`, { cause: err });
      }
      const denied = err instanceof natsErrors.PermissionViolationError ? err : (err as Error).cause;
      if (denied instanceof natsErrors.PermissionViolationError) {
        throw new BoxcarError(
          ErrorCode.forbidden,
          `NATS refused ${subject}: the credential of ${this.identity.role} ${this.identity.user} may not publish there`,
          { cause: err },
        );
      }
      if (err instanceof natsErrors.TimeoutError) {
        throw new BoxcarError(ErrorCode.unavailable, `no reply on ${subject} within ${this.timeoutMs} ms`, { cause: err });
      }
      throw err;
    }
    const parsed = parseWith(ApiReply, JSON.parse(new TextDecoder().decode(reply)), `reply from ${subject}`);
    if (!parsed.ok) throw BoxcarError.fromInfo(parsed.error);
    return parseWith(schema, parsed.data, `reply from ${subject}`);
  }

  async submit(spec: JobSpecInput, opts: SubmitOptions = {}) {
    const uploaded: InputFileRef[] = [];
    try {
      for (const file of opts.upload ?? []) uploaded.push(await this.uploadInput(file.localPath, file.path));
      const reply = await this.request(ApiEndpoint.jobsSubmit, { ...spec, files: [...(spec.files ?? []), ...uploaded] }, SubmitReply);
      if (reply.duplicate) await this.discard(uploaded);
      return reply;
    } catch (err) {
      // Refused: the files will never be used. Unanswered: the job may exist, so keep them.
      if (err instanceof BoxcarError && err.code !== ErrorCode.unavailable) await this.discard(uploaded);
      throw err;
    }
  }

  private async discard(refs: readonly InputFileRef[]): Promise<void> {
    for (const ref of refs) await this.topology.artifacts.delete(ref.object).catch(() => {});
  }

  async uploadInput(localPath: string, workspacePath: string): Promise<InputFileRef> {
    const file = await open(localPath);
    try {
      const object = `inputs/${crypto.randomUUID()}/${workspacePath}`;
      const body = Readable.toWeb(file.createReadStream()) as ReadableStream<Uint8Array>;
      await this.topology.artifacts.put({ name: object }, body);
      return { path: workspacePath, object };
    } finally {
      await file.close();
    }
  }

  async getJob(id: string) {
    return (await this.request(ApiEndpoint.jobsGet, { id }, SubmitReply.pick({ job: true }))).job;
  }

  listJobs(request: ListJobsRequest = {}) {
    return this.request(ApiEndpoint.jobsList, request, ListJobsReply);
  }

  async cancelJob(id: string) {
    return (await this.request(ApiEndpoint.jobsCancel, { id }, CancelReply)).job;
  }

  async retryJob(id: string) {
    return (await this.request(ApiEndpoint.jobsRetry, { id }, CancelReply)).job;
  }

  async waitForJob(id: string, signal?: AbortSignal): Promise<JobRecord> {
    return waitForJobRecord(this.topology, this, await this.getJob(id), (job) => isTerminal(job.state), signal);
  }

  async *events(jobId: string, opts: JobEventsOptions = {}): AsyncGenerator<BoxcarEvent> {
    // The job's owner is in its events' subjects; asking for the job also checks the caller may see it.
    const job = await this.getJob(jobId);
    if (opts.chain) {
      yield* followChain(this.topology, this, job, opts);
      return;
    }
    const { names } = this.topology;
    for await (const msg of readStream(this.topology, names.streams.events, names.subjects.jobEvents(ownerOf(job), jobId), opts)) {
      const event = parseWith(BoxcarEvent, msg.json(), `event ${msg.subject}`);
      yield event;
      if (opts.follow && event.kind === "job" && isTerminal(event.state)) return;
    }
  }

  async *logs(jobId: string, opts: FollowOptions = {}): AsyncGenerator<LogChunk> {
    const { names } = this.topology;
    const job = await this.getJob(jobId);
    const filter = names.subjects.jobLogs(ownerOf(job), jobId);
    const toChunk = (msg: JsMsg): LogChunk => ({
      stream: msg.subject.slice(msg.subject.lastIndexOf(".") + 1) as LogStream,
      data: msg.data,
    });
    let lastSeq = 0;
    if (opts.follow) {
      // The worker stores all output before it writes the final record: once the job is final,
      // stop following and read what is left up to the end of the stream.
      const final = new AbortController();
      const signal = opts.signal ? AbortSignal.any([opts.signal, final.signal]) : final.signal;
      waitForJobRecord(this.topology, this, job, (j) => isTerminal(j.state), signal).then(
        () => final.abort(),
        () => {},
      );
      for await (const msg of readStream(this.topology, names.streams.logs, filter, { follow: true, signal })) {
        lastSeq = msg.seq;
        yield toChunk(msg);
      }
      final.abort();
      if (opts.signal?.aborted) return;
    }
    for await (const msg of readStream(this.topology, names.streams.logs, filter, { startSeq: lastSeq + 1 })) {
      yield toChunk(msg);
    }
  }

  async downloadArtifacts(jobId: string, dir: string): Promise<string[]> {
    const job = await this.getJob(jobId);
    const root = resolve(dir);
    const written: string[] = [];
    for (const artifact of job.artifacts) {
      const target = resolve(join(root, artifact.path));
      if (!target.startsWith(root + sep)) throw new BoxcarError(ErrorCode.invalid, `artifact path escapes ${dir}: ${artifact.path}`);
      const result = await this.topology.artifacts.get(artifact.object);
      if (!result) throw new BoxcarError(ErrorCode.notFound, `artifact ${artifact.path} of job ${jobId} is missing from the Object Store`);
      await mkdir(dirname(target), { recursive: true });
      await pipeline(Readable.fromWeb(result.data as import("node:stream/web").ReadableStream), createWriteStream(target));
      if (await result.error) throw new BoxcarError(ErrorCode.internal, `artifact ${artifact.path} arrived incomplete`);
      written.push(target);
    }
    return written;
  }

  applyAgent(definition: unknown) {
    return this.request(ApiEndpoint.agentsApply, { definition }, ApplyAgentReply);
  }

  async getAgent(name: string) {
    return (await this.request(ApiEndpoint.agentsGet, { name }, ApplyAgentReply.pick({ agent: true }))).agent;
  }

  async listAgents() {
    return (await this.request(ApiEndpoint.agentsList, {}, ListAgentsReply)).agents;
  }

  async removeAgent(name: string) {
    await this.request(ApiEndpoint.agentsRemove, { name }, ApplyAgentReply.pick({ agent: true }));
  }

  async listWorkers() {
    return (await this.request(ApiEndpoint.workersList, {}, ListWorkersReply)).workers;
  }

  waitForChain(jobId: string, signal?: AbortSignal) {
    return waitForChainEnd(this.topology, this, jobId, signal);
  }

  startRun(request: StartRunRequest) {
    return this.request(ApiEndpoint.workflowsStart, request, StartRunReply);
  }

  async getRun(id: string) {
    return (await this.request(ApiEndpoint.workflowsGet, { id }, RunReply)).run;
  }

  async listRuns(request: ListRunsRequest = {}) {
    return (await this.request(ApiEndpoint.workflowsList, request, ListRunsReply)).runs;
  }

  async cancelRun(id: string) {
    return (await this.request(ApiEndpoint.workflowsCancel, { id }, RunReply)).run;
  }

  waitForRun(id: string, signal?: AbortSignal) {
    return waitForRunEnd(this.topology, this, id, signal);
  }

  async *runEvents(runId: string, opts: FollowOptions = {}) {
    yield* followRun(this.topology, await this.getRun(runId), opts);
  }
}
