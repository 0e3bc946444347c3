import { hostname } from "node:os";
import { type Logger, silentLogger } from "@boxcar/common";
import { isTransientJetStreamError, patiently, type Topology, type WorkSigner } from "@boxcar/fabric";
import { type ApiEndpoint, apiEndpointMetadata, BoxcarError, checkAgentPolicy, ErrorCode } from "@boxcar/protocol";
import { AckPolicy, type ConsumerMessages } from "@nats-io/jetstream";
import { type Service, Svcm } from "@nats-io/services";
import type { Registry } from "prom-client";
import { apiHandlers, getAgent, serve } from "./api/api.js";
import { AgentCatalog } from "./catalog/agent-catalog.js";
import { WorkerDirectory } from "./catalog/worker-directory.js";
import { DispatcherMetrics } from "./dispatcher-metrics.js";
import type { AdmissionContext } from "./intake/admission.js";
import { admitIntake } from "./intake/intake.js";
import { JobIndex } from "./jobs/job-index.js";
import { watchJobs } from "./jobs/job-watch.js";
import { ConcurrencyLimits } from "./limits/concurrency.js";
import { JobLoad, PolicyBook } from "./limits/policy.js";
import { ProviderPauses } from "./limits/rate-limit.js";
import { UsageLedger } from "./limits/usage-ledger.js";
import { RetentionSweeper } from "./retention/retention.js";
import { Schedules } from "./schedules/schedules.js";
import { SessionDesk } from "./sessions/sessions.js";
import { AdmissionSweeper } from "./sweeps/admission-sweeper.js";
import { ExpirySweeper } from "./sweeps/expiry.js";
import { GivenUpWork } from "./sweeps/given-up-work.js";
import { LaterWork } from "./sweeps/later-work.js";
import { LostSessionWork } from "./sweeps/lost-session-work.js";
import { WorkRecovery } from "./sweeps/work-recovery.js";
import { RunIndex } from "./workflows/run-index.js";
import { RunFollower } from "./workflows/run-watch.js";
import { Runs } from "./workflows/runs.js";

export interface DispatcherOptions {
  topology: Topology;
  logger?: Logger;
  /** Identifies this dispatcher in logs and `$SRV.INFO`; default `d-<host>-<random>`. */
  dispatcherId?: string;
  /** Version reported by the services API; default the package's. */
  version?: string;
  /** How often jobs past their queue timeout are looked for; default 1000 ms. */
  expiryIntervalMs?: number;
  /** How often ended jobs past the system policy's retention are looked for and deleted; default 60000 ms. */
  retentionIntervalMs?: number;
  /** How often queued jobs without a work item are looked for (see `WorkRecovery`); default 60000 ms. */
  recoveryIntervalMs?: number;
  /** How often the work stream is swept for items JetStream gave up on (see `GivenUpWork`) and for jobs of lost sessions (`LostSessionWork`); default 15000 ms. */
  givenUpIntervalMs?: number;
  /**
   * Signs every work item (see `WorkSigner`); workers configured with its public key run only
   * items it signed. The CLI makes one from the dispatcher's NATS credential.
   */
  signer?: WorkSigner;
  /**
   * Aborted while it still waits for JetStream at start (a recovering cluster), it gives up
   * waiting and throws the abort; what it had started ends with its connection.
   */
  signal?: AbortSignal;
  /** A Prometheus registry to put this dispatcher's metrics in (docs/observability.md); absent: none are kept. */
  metrics?: Registry;
}

export interface Dispatcher extends AsyncDisposable {
  readonly id: string;
  /** Resolves once the dispatcher has stopped. */
  readonly closed: Promise<void>;
  /** Stops answering and consuming; safe to call twice. */
  close(): Promise<void>;
}

const VERSION = "0.1.0";

/**
 * Starts a dispatcher: the request/reply API on `<prefix>.api.>` (a NATS service, so
 * `$SRV.PING` finds it) and the consumer of the durable intake stream. Any number may run at
 * once; they share the service's queue group and the intake consumer.
 */
export async function startDispatcher(opts: DispatcherOptions): Promise<Dispatcher> {
  const { topology } = opts;
  const id = opts.dispatcherId ?? `d-${hostname().replace(/[^A-Za-z0-9_-]/g, "-")}-${Math.random().toString(36).slice(2, 8)}`;
  const log = (opts.logger ?? silentLogger).child({ dispatcherId: id });

  // Started while the cluster recovers, a dispatcher waits for JetStream instead of giving up.
  const wait = <T>(what: string, step: () => Promise<T>) => patiently(what, step, log, opts.signal);
  const workers = await wait("the worker directory", () => WorkerDirectory.open(topology, log));
  const policy = await wait("the system policy", () => PolicyBook.open(topology, log));
  const load = new JobLoad();
  const index = new JobIndex();
  const metrics = opts.metrics ? new DispatcherMetrics(opts.metrics, topology, () => index.counts(() => true)) : undefined;
  const expiry = new ExpirySweeper(topology, log, opts.expiryIntervalMs ?? 1_000, (job) =>
    metrics?.jobAction(job.state === "timed_out" ? "timed_out" : "expire", job.agent),
  );
  const retention = new RetentionSweeper(topology, policy, log, opts.retentionIntervalMs ?? 60_000);
  const agents = await wait("the agents", () => AgentCatalog.open(topology, log));
  const limits = new ConcurrencyLimits(
    topology,
    agents,
    () => policy.policy,
    { signer: opts.signer, workers },
    log,
    opts.givenUpIntervalMs ?? 15_000,
  );
  const publishing = { agents, signer: opts.signer, workers, limits };
  const providerPauses = new ProviderPauses(limits.entries, agents, log);
  const recovery = new WorkRecovery(topology, index, log, opts.recoveryIntervalMs ?? 60_000, publishing);
  const admissions = new AdmissionSweeper(topology, log, 1_000, publishing, recovery);
  const ctx: AdmissionContext = {
    log,
    agents,
    workers,
    signer: opts.signer,
    policy,
    load,
    onWorkPublished: (id) => admissions.workPublished(id),
    metrics,
    limits,
    sessions: new SessionDesk(
      topology,
      workers,
      async (name) => {
        const agent = await getAgent(topology, name);
        checkAgentPolicy(agent, policy.policy.agents, "the system policy");
        return agent;
      },
      () => policy,
    ),
  };
  const runIndex = new RunIndex();
  // Started once the job watch runs (its jobs' ends let queued ticks fire).
  let schedules: Schedules | undefined;
  const runs = new Runs(topology, ctx, runIndex);
  const follower = new RunFollower(topology, runs, ctx);
  const jobWatch = await wait("the job records", () =>
    watchJobs(topology, log, [
      (key, job) => expiry.observe(key, job),
      (key, job) => admissions.observe(key, job),
      (key, job) => retention.observe(key, job),
      index.observe,
      follower.observeJob,
      load.observe,
      limits.observe,
      providerPauses.observe,
      (key, job) => schedules?.observe(key, job),
    ]),
  );
  // Ends seen from now on free their places; what the replay shows, the sweep deals with.
  void jobWatch.caughtUp.then(() => limits.followEnds());
  await wait("the workflow runs", () =>
    follower.start(
      (key, run, ended) => {
        runIndex.observe(key, run);
        retention.observeRun(key, run, ended);
        ctx.metrics?.observeRun(key, run);
      },
      () => runIndex.caughtUpNow(),
    ),
  );
  const givenUp = await wait("the max-deliveries advisories", () =>
    GivenUpWork.start(topology, log, opts.signer, opts.givenUpIntervalMs ?? 15_000, (job) => metrics?.jobAction("dead", job.agent)),
  );
  const lostSessionWork = new LostSessionWork(topology, workers, log, opts.givenUpIntervalMs ?? 15_000);
  const laterWork = await wait("the delayed jobs' consumer", () => LaterWork.start(topology, publishing, log));
  schedules = await wait("the schedules", () => Schedules.start(topology, ctx, log, opts.givenUpIntervalMs ?? 15_000));
  const usage = await wait("the usage consumer", () => UsageLedger.start(topology, { policy: () => policy.policy, index, metrics }, log));
  ctx.usage = usage;
  const service: Service = await new Svcm(topology.nc).add({
    name: topology.names.serviceName,
    version: opts.version ?? VERSION,
    description: "Boxcar dispatcher: admits jobs and answers the job, agent and worker API",
    metadata: { dispatcherId: id, prefix: topology.names.prefix },
  });
  for (const [endpoint, handler] of Object.entries(
    apiHandlers(topology, ctx, { runs, retention, schedules, usage, jobs: { index, caughtUp: jobWatch.caughtUp } }),
  )) {
    service.addEndpoint(endpoint.replaceAll(".", "-"), {
      subject: topology.names.subjects.apiEndpoint(endpoint as ApiEndpoint),
      metadata: apiEndpointMetadata(endpoint as ApiEndpoint),
      handler: (err, msg) => {
        if (err) {
          log.error({ err }, "service endpoint failed");
          return;
        }
        void serve(topology, endpoint as ApiEndpoint, handler, msg, log);
      },
    });
  }

  const { jsm, js, names } = topology;
  await wait("the intake consumer", () =>
    jsm.consumers.info(names.streams.submit, names.intakeConsumer).catch((err: unknown) => {
      if (isTransientJetStreamError(err)) throw err;
      return jsm.consumers.add(names.streams.submit, {
        durable_name: names.intakeConsumer,
        ack_policy: AckPolicy.Explicit,
        ack_wait: topology.options.ackWaitMs * 1_000_000,
      });
    }),
  );
  const streamCreated = (await wait("the intake stream", () => jsm.streams.info(names.streams.submit))).created;
  const consumer = await wait("the intake consumer", () => js.consumers.get(names.streams.submit, names.intakeConsumer));
  const intake: ConsumerMessages = await consumer.consume({ max_messages: 64 });
  const intakeDone = (async () => {
    for await (const msg of intake) {
      try {
        await admitIntake(topology, msg, streamCreated, ctx);
      } catch (err) {
        // A full queue or store is waited out: the submission stays in the stream until there is room.
        const waiting = err instanceof BoxcarError && (err.code === ErrorCode.queueFull || err.code === ErrorCode.storageFull);
        if (waiting) log.warn({ seq: msg.seq, code: err.code }, "intake submission waits for room; it will be redelivered");
        else log.error({ err, seq: msg.seq }, "intake submission failed; it will be redelivered");
        msg.nak(waiting ? 5_000 : 1_000);
      }
    }
  })();
  log.info({ service: names.serviceName, prefix: names.prefix }, "dispatcher started");

  let closing: Promise<void> | undefined;
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => {
    resolveClosed = r;
  });
  const close = () =>
    (closing ??= (async () => {
      const steps = [
        () => service.stop().then(() => undefined),
        () => intake.close().then(() => undefined),
        () => intakeDone,
        () => givenUp.close(),
        () => lostSessionWork.close(),
        () => laterWork.close(),
        () => schedules.close(),
        () => usage.close(),
        async () => jobWatch.stop(),
        async () => follower.close(),
        async () => runs.close(),
        async () => workers.close(),
        async () => policy.close(),
        async () => agents.close(),
        async () => expiry.close(),
        () => retention.close(),
        async () => recovery.close(),
        async () => admissions.close(),
        () => limits.close(),
      ];
      for (const step of steps) {
        try {
          await step();
        } catch (err) {
          log.warn({ err }, "dispatcher shutdown step failed");
        }
      }
      log.info({}, "dispatcher stopped");
      resolveClosed();
    })());
  return { id, closed, close, [Symbol.asyncDispose]: close };
}
