import { checkAgentPolicy } from "@boxcar/protocol/internal";
import { getAgent } from "./api/api.js";
import { ApiService } from "./api/service.js";
import { AgentCatalog } from "./catalog/agent-catalog.js";
import { WorkerDirectory } from "./catalog/worker-directory.js";
import { DispatcherMetrics } from "./dispatcher-metrics.js";
import { type DispatcherOptions, resolveDispatcherOptions } from "./dispatcher-options.js";
import type { AdmissionContext } from "./intake/admission.js";
import { IntakeConsumer } from "./intake/intake.js";
import { IndexSnapshots, type StartingPoint } from "./jobs/index-snapshots.js";
import { JobIndex } from "./jobs/job-index.js";
import { JobWatch } from "./jobs/job-watch.js";
import { ConcurrencyLimits } from "./limits/concurrency.js";
import { JobLoad, PolicyBook } from "./limits/policy.js";
import { ProviderPauses } from "./limits/rate-limit.js";
import { UsageLedger } from "./limits/usage-ledger.js";
import { Parts } from "./loops/parts.js";
import { RetentionSweep } from "./retention/retention.js";
import { Schedules } from "./schedules/schedules.js";
import { SessionDesk } from "./sessions/sessions.js";
import { AdmissionSweep } from "./sweeps/admission-sweep.js";
import { ExpirySweep } from "./sweeps/expiry.js";
import { GivenUpSweep } from "./sweeps/given-up-work.js";
import { LaterConsumer } from "./sweeps/later-work.js";
import { LostSessionSweep } from "./sweeps/lost-session-work.js";
import { RecoverySweep } from "./sweeps/work-recovery.js";
import { RunIndex } from "./workflows/run-index.js";
import { RunFollower } from "./workflows/run-watch.js";
import { Runs } from "./workflows/runs.js";

export interface Dispatcher extends AsyncDisposable {
  readonly id: string;
  /** Resolves once the dispatcher has stopped. */
  readonly closed: Promise<void>;
  /** Stops answering and consuming; safe to call twice. */
  close(): Promise<void>;
}

/**
 * Starts a dispatcher: the request/reply API on `<prefix>.api.>` (a NATS service, so
 * `$SRV.PING` finds it) and the consumer of the durable intake stream. Any number may run at
 * once; they share the service's queue group and the intake consumer.
 *
 * Its parts are made first (nothing is asked of NATS), then started in the order `parts` lists
 * them and stopped in the reverse order: a part starts after, and stops before, the parts it
 * uses. Started while the cluster recovers, a dispatcher waits for JetStream instead of giving up.
 */
export async function startDispatcher(opts: DispatcherOptions): Promise<Dispatcher> {
  const { topology, id, log, intervals, signer, ...resolved } = resolveDispatcherOptions(opts);

  // What it knows, kept by watches: the workers, the policy, the agents, the jobs and runs.
  const workers = new WorkerDirectory(topology, log, intervals.goneWorkers);
  const policy = new PolicyBook(topology, log);
  const agents = new AgentCatalog(topology, log);
  // One entry a job, which the quotas' counts and retention read too.
  const index = new JobIndex();
  const load = new JobLoad(index);
  const runIndex = new RunIndex();
  const metrics = resolved.metrics ? new DispatcherMetrics(resolved.metrics, topology, () => index.counts(() => true)) : undefined;

  // What holds jobs back, and the sweeps that finish what was cut short.
  const limits = new ConcurrencyLimits(topology, agents, () => policy.policy, { signer, workers }, log, intervals.concurrency);
  const publishing = { agents, signer, workers, limits };
  const providerPauses = new ProviderPauses(limits.entries, agents, log);
  const expiry = new ExpirySweep(topology, log, intervals.expiry, (job) =>
    metrics?.jobAction(job.state === "timed_out" ? "timed_out" : "expire", job.agent),
  );
  // Written from the watch's position (`jobWatch`, below); read at start and by retention.
  const snapshots = new IndexSnapshots(
    topology,
    index,
    () => jobWatch.position(),
    (): [string, number][] => retention.markersOf("jobs"),
    log,
    intervals.indexSnapshot,
    Math.min(intervals.indexSnapshot, SNAPSHOT_COVER_GRACE_MS),
  );
  const retention: RetentionSweep = new RetentionSweep(topology, policy, log, intervals.retention, index, snapshots);
  let startingPoint: Promise<StartingPoint | undefined> | undefined;
  const recovery = new RecoverySweep(topology, index, log, intervals.recovery, publishing);
  const admissions = new AdmissionSweep(topology, log, intervals.admission, publishing, recovery);
  const givenUp = new GivenUpSweep(topology, log, signer, intervals.givenUp, (job) => metrics?.jobAction("dead", job.agent));
  const lostSessions = new LostSessionSweep(topology, workers, log, intervals.lostSession);
  const later = new LaterConsumer(topology, publishing, log);

  // How jobs come about: admission, and what admits jobs besides submissions.
  const ctx: AdmissionContext = {
    log,
    agents,
    workers,
    signer,
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
  const runs = new Runs(topology, ctx, runIndex);
  const follower = new RunFollower(topology, runs, ctx);
  const schedules = new Schedules(topology, ctx, log, intervals.schedules);
  const usage = new UsageLedger(topology, { policy: () => policy.policy, index, metrics }, log);
  const jobWatch = new JobWatch(
    topology,
    log,
    [
      (key, job) => expiry.observe(key, job),
      (key, job) => admissions.observe(key, job),
      (key, job) => retention.observe(key, job),
      // The quotas' counts (`load`) follow it.
      index.observe,
      follower.observeJob,
      limits.observe,
      providerPauses.observe,
      // Once the schedules have started: its jobs' ends let queued ticks fire.
      schedules.observe,
    ],
    (key, revision) => retention.observeMarker("jobs", key, revision),
  );
  // Ends seen from now on free their places; what the replay shows, the sweep deals with. And
  // the markers past the snapshot it started from, read, may go.
  void jobWatch.caughtUp.then(() => {
    limits.followEnds();
    return snapshots.release();
  });
  const api = new ApiService(
    topology,
    ctx,
    { runs, retention, schedules, usage, jobs: { index, caughtUp: jobWatch.caughtUp } },
    { dispatcherId: id, version: resolved.version },
  );
  const intake = new IntakeConsumer(topology, ctx);

  // Started in this order, stopped in the reverse: the shutdown order is this list, read from the end.
  const parts = new Parts(
    [
      { name: "the worker directory", start: () => workers.start(), stop: () => workers.close() },
      { name: "the system policy", start: () => policy.start(), stop: () => policy.close() },
      { name: "the agents", start: () => agents.start(), stop: () => agents.close() },
      { name: "the concurrency limits", start: () => limits.start(), stop: () => limits.stop() },
      { name: "the expiry sweep", start: () => expiry.start(), stop: () => expiry.stop() },
      { name: "the retention sweep", start: () => retention.start(), stop: () => retention.stop() },
      { name: "the recovery sweep", start: () => recovery.start(), stop: () => recovery.stop() },
      { name: "the admission sweep", start: () => admissions.start(), stop: () => admissions.stop() },
      { name: "the workflow runs' advances", stop: () => runs.stop() },
      {
        name: "the job records",
        start: async () => {
          // Once: a start tried again (JetStream recovering) goes on from the same point.
          startingPoint ??= snapshots.restore().then((from) => {
            if (from) {
              const { unsettled, markers, ...rest } = from;
              log.info({ ...rest, unsettled: unsettled.length }, "the job index starts from a snapshot");
              for (const [key, seq] of markers) retention.observeMarker("jobs", key, seq);
            }
            return from;
          });
          await jobWatch.start(await startingPoint);
        },
        stop: () => jobWatch.stop(),
      },
      { name: "the job index's snapshots", start: () => snapshots.start(), stop: () => snapshots.stop() },
      {
        name: "the workflow runs",
        start: () =>
          follower.start(
            (key, run, ended) => {
              runIndex.observe(key, run);
              retention.observeRun(key, run, ended);
              metrics?.observeRun(key, run);
            },
            () => runIndex.caughtUpNow(),
            (key, revision) => retention.observeMarker("workflows", key, revision),
          ),
        stop: () => follower.stop(),
      },
      { name: "the max-deliveries advisories", start: () => givenUp.start(), stop: () => givenUp.stop() },
      { name: "the lost-session sweep", start: () => lostSessions.start(), stop: () => lostSessions.stop() },
      { name: "the delayed jobs' consumer", start: () => later.start(), stop: () => later.stop() },
      { name: "the schedules", start: () => schedules.start(), stop: () => schedules.stop() },
      {
        name: "the usage consumer",
        start: async () => {
          await usage.start();
          // Budgets are checked from now on.
          ctx.usage = usage;
        },
        stop: () => usage.stop(),
      },
      { name: "the API", start: () => api.start(), stop: () => api.stop() },
      { name: "the intake consumer", start: () => intake.start(), stop: () => intake.stop() },
    ],
    log,
  );
  await parts.start(resolved.signal);
  log.info({ service: topology.names.serviceName, prefix: topology.names.prefix }, "dispatcher started");

  let closing: Promise<void> | undefined;
  let resolveClosed!: () => void;
  const closed = new Promise<void>((r) => {
    resolveClosed = r;
  });
  const close = () =>
    (closing ??= (async () => {
      await parts.stop();
      log.info({}, "dispatcher stopped");
      resolveClosed();
    })());
  return { id, closed, close, [Symbol.asyncDispose]: close };
}

/** How long a dispatcher knows a job index snapshot before retention removes the delete markers it covers. */
const SNAPSHOT_COVER_GRACE_MS = 120_000;
