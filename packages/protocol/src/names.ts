/**
 * Every NATS name Boxcar uses, derived from one prefix so several Boxcar systems can share a
 * NATS account. The default prefix is `boxcar`.
 */

import type { Identity } from "./principal.js";
import type { Priority } from "./priority.js";

export const DEFAULT_PREFIX = "boxcar";

/** The owner of what was made without one: records and events from before owners, and every job on a server without authentication. */
export const LOCAL_OWNER = "local";

/** A subject token: no dots, spaces or wildcards. Job ids, agent names and pools are tokens. */
export const TOKEN_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;

export const LogStream = { stdout: "stdout", stderr: "stderr" } as const;
export type LogStream = (typeof LogStream)[keyof typeof LogStream];

export type EventKind = "job" | "sandbox" | "worker" | "workflow" | "session";

export interface Names {
  readonly prefix: string;
  readonly streams: {
    /** Durable intake: `<prefix>.submit.<owner>.<agent>`, work-queue retention. */
    readonly submit: string;
    /**
     * Work items: `<prefix>.work.<pool>` (normal priority) and `<prefix>.work.<pool>.<high|low>`,
     * work-queue retention, one consumer per pool and priority.
     */
    readonly work: string;
    /** Job, sandbox and worker events: `<prefix>.evt.>`, limits retention. */
    readonly events: string;
    /** Live agent output: `<prefix>.log.<owner>.<jobId>.<stdout|stderr>`, size-capped. */
    readonly logs: string;
    /** Final records of dead jobs: `<prefix>.dead.<agent>`. */
    readonly dead: string;
  };
  readonly buckets: {
    readonly jobs: string;
    readonly agents: string;
    readonly workers: string;
    readonly idempotency: string;
    /** Workflow runs and handoff chains. */
    readonly workflows: string;
    readonly artifacts: string;
    /** The admin's system policy: what agents may ask for, and users' quotas (one key, `system`). */
    readonly policy: string;
    /** Sessions' records, written by the workers that hold them. */
    readonly sessions: string;
    /** Rate limits' state (when each limited agent may next start a job), written by dispatchers. */
    readonly limits: string;
    /** Schedules and what became of their ticks (`<owner>.<name>`), written by dispatchers. */
    readonly schedules: string;
    /** Usage per day, agent and user (`<day>.agent.<name>`, `<day>.user.<name>`), summed by dispatchers. */
    readonly usage: string;
    /** Model calls per window and limit (`<limit>.<window>`), counted by the workers' model gateways against the policy's model limits. */
    readonly modelUse: string;
    /** Snapshots of sessions' workspaces (an Object Store), written by the workers that hold the sessions. */
    readonly snapshots: string;
    /** Snapshots of the dispatchers' job index (an Object Store), which a dispatcher starts from: the dispatchers' alone. */
    readonly jobIndex: string;
  };
  /** The durable consumer all dispatchers share on the intake stream. */
  readonly intakeConsumer: string;
  /**
   * The durable consumer all workers of `pool` share on the work stream for one priority:
   * `pool-<pool>` for normal, `high-<pool>` and `low-<pool>` for the others.
   */
  poolConsumer(pool: string, priority?: Priority): string;
  /** The pool and priority a work consumer's name stands for; undefined for any other name. */
  poolOfConsumer(name: string): { pool: string; priority: Priority } | undefined;
  /**
   * The durable consumer on the work stream of one worker's own items, the jobs to run in the
   * sessions it holds: `worker-<workerId>`.
   */
  workerConsumer(workerId: string): string;
  /** The worker a worker consumer's name stands for; undefined for any other name. */
  workerOfConsumer(name: string): string | undefined;
  /** The durable consumer all dispatchers share on the delayed jobs' markers: `later`. */
  readonly laterConsumer: string;
  /** The dispatchers' consumer of the `usage` job events, which sums them into the usage bucket. */
  readonly usageConsumer: string;
  /** Service name under which dispatchers register with the NATS services API. */
  readonly serviceName: string;
  /**
   * The inbox prefix of `user`'s connections (`_INBOX.<user>`): a user may subscribe only to its
   * own inboxes, so no one reads the replies sent to another.
   */
  inboxPrefix(user: string): string;
  readonly subjects: {
    /** Durable intake of `owner`'s submissions to `agent`: `<prefix>.submit.<owner>.<agent>`. */
    submit(owner: string, agent: string): string;
    submitAll: string;
    /** Where a pool's work items of one priority go (normal when left out). */
    work(pool: string, priority?: Priority): string;
    /** Where the jobs to run in a worker's sessions go: `<prefix>.work.@<workerId>` (`@` is in no pool's name). */
    sessionWork(workerId: string): string;
    /** Where a delayed job waits for its time: `<prefix>.work.~later.<jobId>` (`~` is in no pool's name). */
    laterWork(jobId: string): string;
    laterWorkAll: string;
    /**
     * Where a job waits for a place under a concurrency limit:
     * `<prefix>.work.~held.<agent>.<value>.<jobId>` (`value`: a digest of its key's value, or
     * `all`), or `<prefix>.work.~held.=pool.<pool>.<jobId>` for a pool's; `*` for the job: every
     * job waiting under that limit.
     */
    heldWork(place: string, jobId: string): string;
    workAll: string;
    /**
     * Where `caller` sends requests to `endpoint`: `<prefix>.api.<role>.<user>.<endpoint>`. NATS
     * permissions let a user publish only under its own role and name.
     */
    api(caller: Identity, endpoint: ApiEndpoint): string;
    /** The requests of one principal: `<prefix>.api.<role>.<user>`. */
    apiPrincipal(caller: Identity): string;
    /** What a dispatcher listens on for `endpoint`, from any principal. */
    apiEndpoint(endpoint: ApiEndpoint): string;
    apiAll: string;
    /**
     * A worker's events: `<prefix>.evt.worker.<workerId>.<type>`; a job's, sandbox's or run's:
     * `<prefix>.evt.<kind>.<owner>.<id>.<type>`, so NATS permissions can give each user its own.
     */
    event(kind: EventKind, id: string, type: string, owner?: string): string;
    /** All events of one job (job and sandbox kinds). */
    jobEvents(owner: string, jobId: string): string;
    /** All events of one workflow run (not those of its jobs). */
    runEvents(owner: string, runId: string): string;
    /** Every job, sandbox and run event of one user. */
    ownerEvents(owner: string): string;
    /** The events of one kind (not `worker`) of one user: `<prefix>.evt.<kind>.<owner>.>`. */
    ownerEventsOf(kind: Exclude<EventKind, "worker">, owner: string): string;
    eventsAll: string;
    log(owner: string, jobId: string, stream: LogStream): string;
    jobLogs(owner: string, jobId: string): string;
    /** The output of every job of one user. */
    ownerLogs(owner: string): string;
    logsAll: string;
    cancel(jobId: string): string;
    cancelAll: string;
    /** Where a dispatcher delivers a signal to a running job, to the worker running it: `<prefix>.ctl.signal.<jobId>`. */
    signal(jobId: string): string;
    signalAll: string;
    dead(agent: string): string;
    deadAll: string;
    /**
     * Where `owner` sends the chunks of one upload to the dispatcher that opened it (core NATS):
     * `<prefix>.upload.<owner>.<token>`, the token unguessable.
     */
    upload(owner: string, token: string): string;
    /** The uploads of one user. */
    ownerUploads(owner: string): string;
    uploadsAll: string;
    /** Where a dispatcher asks the worker holding a session to `op` (open, exec, cancel, close, a file's read, write, list, remove): `<prefix>.sess.<workerId>.<op>`. */
    session(workerId: string, op: string): string;
    sessionAll: string;
    /**
     * A tunnel to a port in a session (docs/sessions.md#ports), core NATS, its bytes one way:
     * `<prefix>.tunnel.<user>.<tunnelId>.in` (the caller's, into the session) and `.out` (the
     * session's worker's, out of it). `user` is who opened it: only that user (and admins) may use them.
     */
    tunnel(user: string, tunnelId: string, way: TunnelWay): string;
    /** The tunnels of one user, both ways. */
    ownerTunnels(user: string): string;
    /** Every tunnel's bytes one way (`*.*` for the user and the tunnel). */
    tunnelsAll(way: TunnelWay): string;
  };
}

/** Which way a tunnel's subject carries bytes: `in` to the session, `out` from it. */
export const TunnelWay = { in: "in", out: "out" } as const;
export type TunnelWay = (typeof TunnelWay)[keyof typeof TunnelWay];

export const ApiEndpoint = {
  jobsSubmit: "jobs.submit",
  jobsGet: "jobs.get",
  jobsList: "jobs.list",
  jobsCount: "jobs.count",
  jobsCancel: "jobs.cancel",
  jobsRetry: "jobs.retry",
  jobsRerun: "jobs.rerun",
  jobsClean: "jobs.clean",
  agentsApply: "agents.apply",
  agentsGet: "agents.get",
  agentsList: "agents.list",
  agentsRemove: "agents.remove",
  workersList: "workers.list",
  workflowsStart: "workflows.start",
  workflowsGet: "workflows.get",
  workflowsList: "workflows.list",
  workflowsCancel: "workflows.cancel",
  jobsEvents: "jobs.events",
  jobsLogs: "jobs.logs",
  jobsArtifact: "jobs.artifact",
  workflowsEvents: "workflows.events",
  inputsUpload: "inputs.upload",
  policyGet: "policy.get",
  policySet: "policy.set",
  sessionsOpen: "sessions.open",
  sessionsExec: "sessions.exec",
  sessionsClose: "sessions.close",
  sessionsGet: "sessions.get",
  sessionsList: "sessions.list",
  sessionsEvents: "sessions.events",
  sessionsLogs: "sessions.logs",
  sessionsCancel: "sessions.cancel",
  sessionsStart: "sessions.start",
  sessionsProcesses: "sessions.processes",
  sessionsWait: "sessions.wait",
  sessionsKill: "sessions.kill",
  sessionsInput: "sessions.input",
  sessionsOutput: "sessions.output",
  sessionsFilesRead: "sessions.files.read",
  sessionsFilesWrite: "sessions.files.write",
  sessionsFilesList: "sessions.files.list",
  sessionsFilesRemove: "sessions.files.remove",
  sessionsFilesStat: "sessions.files.stat",
  sessionsWatch: "sessions.watch",
  sessionsUnwatch: "sessions.unwatch",
  sessionsConnect: "sessions.connect",
  sessionsShell: "sessions.shell",
  sessionsPause: "sessions.pause",
  sessionsResume: "sessions.resume",
  sessionsSnapshot: "sessions.snapshot",
  snapshotsList: "snapshots.list",
  snapshotsRemove: "snapshots.remove",
  schedulesCreate: "schedules.create",
  schedulesUpdate: "schedules.update",
  schedulesGet: "schedules.get",
  schedulesList: "schedules.list",
  schedulesPause: "schedules.pause",
  schedulesResume: "schedules.resume",
  schedulesDelete: "schedules.delete",
  usageGet: "usage.get",
  workflowsApprove: "workflows.approve",
  jobsSignal: "jobs.signal",
  workflowsSignal: "workflows.signal",
} as const;
export type ApiEndpoint = (typeof ApiEndpoint)[keyof typeof ApiEndpoint];

export function names(prefix: string = DEFAULT_PREFIX): Names {
  if (!/^[a-z][a-z0-9_-]{0,31}$/.test(prefix)) {
    throw new RangeError(`invalid prefix ${JSON.stringify(prefix)}: use lowercase letters, digits, '-' or '_'`);
  }
  const upper = prefix.toUpperCase().replaceAll("-", "_");
  const bucket = prefix.replaceAll("-", "_");
  return {
    prefix,
    streams: {
      submit: `${upper}_SUBMIT`,
      work: `${upper}_WORK`,
      events: `${upper}_EVENTS`,
      logs: `${upper}_LOGS`,
      dead: `${upper}_DEAD`,
    },
    buckets: {
      jobs: `${bucket}_jobs`,
      agents: `${bucket}_agents`,
      workers: `${bucket}_workers`,
      idempotency: `${bucket}_idempotency`,
      workflows: `${bucket}_workflows`,
      artifacts: `${bucket}_artifacts`,
      policy: `${bucket}_policy`,
      sessions: `${bucket}_sessions`,
      limits: `${bucket}_limits`,
      schedules: `${bucket}_schedules`,
      usage: `${bucket}_usage`,
      modelUse: `${bucket}_model_use`,
      snapshots: `${bucket}_snapshots`,
      jobIndex: `${bucket}_job_index`,
    },
    intakeConsumer: "dispatcher",
    poolConsumer: (pool, priority = "normal") => (priority === "normal" ? `pool-${pool}` : `${priority}-${pool}`),
    poolOfConsumer: (name) => {
      const match = /^(pool|high|low)-(.+)$/.exec(name);
      return match ? { pool: match[2] as string, priority: match[1] === "pool" ? "normal" : (match[1] as Priority) } : undefined;
    },
    laterConsumer: "later",
    usageConsumer: "usage",
    workerConsumer: (workerId) => `worker-${workerId}`,
    workerOfConsumer: (name) => (name.startsWith("worker-") ? name.slice("worker-".length) : undefined),
    serviceName: `${prefix}-dispatcher`,
    inboxPrefix: (user) => `_INBOX.${user}`,
    subjects: {
      submit: (owner, agent) => `${prefix}.submit.${owner}.${agent}`,
      submitAll: `${prefix}.submit.>`,
      work: (pool, priority = "normal") => (priority === "normal" ? `${prefix}.work.${pool}` : `${prefix}.work.${pool}.${priority}`),
      sessionWork: (workerId) => `${prefix}.work.@${workerId}`,
      laterWork: (jobId) => `${prefix}.work.~later.${jobId}`,
      laterWorkAll: `${prefix}.work.~later.>`,
      heldWork: (place, jobId) => `${prefix}.work.~held.${place}.${jobId}`,
      workAll: `${prefix}.work.>`,
      api: (caller, endpoint) => `${prefix}.api.${caller.role}.${caller.user}.${endpoint}`,
      apiPrincipal: (caller) => `${prefix}.api.${caller.role}.${caller.user}`,
      apiEndpoint: (endpoint) => `${prefix}.api.*.*.${endpoint}`,
      apiAll: `${prefix}.api.>`,
      event: (kind, id, type, owner = LOCAL_OWNER) =>
        kind === "worker" ? `${prefix}.evt.worker.${id}.${type}` : `${prefix}.evt.${kind}.${owner}.${id}.${type}`,
      jobEvents: (owner, jobId) => `${prefix}.evt.*.${owner}.${jobId}.*`,
      runEvents: (owner, runId) => `${prefix}.evt.workflow.${owner}.${runId}.*`,
      ownerEvents: (owner) => `${prefix}.evt.*.${owner}.>`,
      ownerEventsOf: (kind, owner) => `${prefix}.evt.${kind}.${owner}.>`,
      eventsAll: `${prefix}.evt.>`,
      log: (owner, jobId, stream) => `${prefix}.log.${owner}.${jobId}.${stream}`,
      jobLogs: (owner, jobId) => `${prefix}.log.${owner}.${jobId}.*`,
      ownerLogs: (owner) => `${prefix}.log.${owner}.>`,
      logsAll: `${prefix}.log.>`,
      cancel: (jobId) => `${prefix}.ctl.cancel.${jobId}`,
      cancelAll: `${prefix}.ctl.cancel.*`,
      signal: (jobId) => `${prefix}.ctl.signal.${jobId}`,
      signalAll: `${prefix}.ctl.signal.*`,
      dead: (agent) => `${prefix}.dead.${agent}`,
      deadAll: `${prefix}.dead.>`,
      upload: (owner, token) => `${prefix}.upload.${owner}.${token}`,
      ownerUploads: (owner) => `${prefix}.upload.${owner}.*`,
      uploadsAll: `${prefix}.upload.>`,
      session: (workerId, op) => `${prefix}.sess.${workerId}.${op}`,
      sessionAll: `${prefix}.sess.>`,
      tunnel: (user, tunnelId, way) => `${prefix}.tunnel.${user}.${tunnelId}.${way}`,
      ownerTunnels: (user) => `${prefix}.tunnel.${user}.>`,
      tunnelsAll: (way) => `${prefix}.tunnel.*.*.${way}`,
    },
  };
}
