import type { ModelCall } from "@boxcar/protocol";
import { Counter, Gauge, Histogram, type Registry } from "prom-client";

/** Seconds, from a no-op job's milliseconds to an agent's hours. */
const RUN_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600];
const START_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** What the worker's gauges read when scraped. */
export interface WorkerLoad {
  running: number;
  capacity: number;
  /** Sandboxes standing ready in warm pools. */
  warm: number;
}

/**
 * A worker's Prometheus metrics (docs/observability.md), registered in the registry the caller
 * serves. Labels are bounded: agent and pool names, outcomes and sandbox kinds, never job ids.
 */
export class WorkerMetrics {
  private readonly attempts: Counter<"agent" | "pool" | "outcome">;
  private readonly attemptSeconds: Histogram<"agent" | "pool" | "outcome">;
  private readonly jobSeconds: Histogram<"agent" | "outcome">;
  private readonly queueWait: Histogram<"pool">;
  private readonly sandboxCreate: Histogram<"kind">;
  private readonly sandboxStarts: Counter<"kind" | "start">;
  private readonly cpuSeconds: Counter<"agent">;
  private readonly artifactBytes: Counter<"agent">;
  private readonly modelCalls: Counter<"provider" | "model" | "status">;
  private readonly modelTokens: Counter<"provider" | "model" | "direction">;
  private readonly modelSeconds: Histogram<"provider" | "model">;

  constructor(registry: Registry, load: () => WorkerLoad) {
    const registers = [registry];
    this.attempts = new Counter({
      name: "boxcar_worker_attempts_total",
      help: "Attempts this worker ended, by agent, pool and outcome (a final state, retrying, dead or requeued)",
      labelNames: ["agent", "pool", "outcome"],
      registers,
    });
    this.attemptSeconds = new Histogram({
      name: "boxcar_worker_attempt_seconds",
      help: "How long an attempt took on this worker, from its claim to its end, by how it ended",
      labelNames: ["agent", "pool", "outcome"],
      buckets: RUN_BUCKETS,
      registers,
    });
    this.jobSeconds = new Histogram({
      name: "boxcar_job_duration_seconds",
      help: "How long a job took, from its submit to its end, for jobs that ended in an attempt on this worker, by agent and final state",
      labelNames: ["agent", "outcome"],
      buckets: RUN_BUCKETS,
      registers,
    });
    this.queueWait = new Histogram({
      name: "boxcar_worker_queue_wait_seconds",
      help: "How long a job waited in the queue before this worker claimed it",
      labelNames: ["pool"],
      buckets: RUN_BUCKETS,
      registers,
    });
    this.sandboxCreate = new Histogram({
      name: "boxcar_sandbox_create_seconds",
      help: "How long creating a sandbox took, by kind",
      labelNames: ["kind"],
      buckets: START_BUCKETS,
      registers,
    });
    this.sandboxStarts = new Counter({
      name: "boxcar_sandbox_starts_total",
      help: "Sandboxes that say how they started, by kind and start: warm_hit (from a warm pool) or cold",
      labelNames: ["kind", "start"],
      registers,
    });
    this.cpuSeconds = new Counter({
      name: "boxcar_worker_agent_cpu_seconds_total",
      help: "CPU time agents used on this worker, by agent (Docker sandboxes report it)",
      labelNames: ["agent"],
      registers,
    });
    this.artifactBytes = new Counter({
      name: "boxcar_worker_artifact_bytes_total",
      help: "Bytes of artifacts this worker stored, by agent",
      labelNames: ["agent"],
      registers,
    });
    this.modelCalls = new Counter({
      name: "boxcar_worker_model_calls_total",
      help: "Calls agents made through this worker's model gateway, by provider, model and HTTP status",
      labelNames: ["provider", "model", "status"],
      registers,
    });
    this.modelTokens = new Counter({
      name: "boxcar_worker_model_tokens_total",
      help: "Tokens of the calls through this worker's model gateway, by provider, model and direction (in, out)",
      labelNames: ["provider", "model", "direction"],
      registers,
    });
    this.modelSeconds = new Histogram({
      name: "boxcar_worker_model_call_seconds",
      help: "How long calls through this worker's model gateway took, request to the answer's end",
      labelNames: ["provider", "model"],
      buckets: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
      registers,
    });
    new Gauge({
      name: "boxcar_worker_jobs_running",
      help: "Jobs this worker is running now",
      registers,
      collect() {
        this.set(load().running);
      },
    });
    new Gauge({
      name: "boxcar_worker_slots",
      help: "How many jobs this worker runs at once",
      registers,
      collect() {
        this.set(load().capacity);
      },
    });
    new Gauge({
      name: "boxcar_worker_warm_sandboxes",
      help: "Sandboxes this worker keeps started and ready for jobs to come (its warm pool)",
      registers,
      collect() {
        this.set(load().warm);
      },
    });
  }

  claimed(pool: string, queuedAt: string | undefined, startedAt: string | undefined): void {
    if (!queuedAt || !startedAt) return;
    this.queueWait.observe({ pool }, Math.max(0, Date.parse(startedAt) - Date.parse(queuedAt)) / 1000);
  }

  sandboxCreated(kind: string, ms: number, start: string | undefined): void {
    this.sandboxCreate.observe({ kind }, ms / 1000);
    if (start) this.sandboxStarts.inc({ kind, start });
  }

  modelCall(call: ModelCall): void {
    const labels = { provider: call.provider, model: call.model ?? "unknown" };
    this.modelCalls.inc({ ...labels, status: String(call.status) });
    this.modelTokens.inc({ ...labels, direction: "in" }, call.tokensIn);
    this.modelTokens.inc({ ...labels, direction: "out" }, call.tokensOut);
    this.modelSeconds.observe(labels, call.latencyMs / 1000);
  }

  /** A job that reached its final state (or `dead`) in an attempt here: from its submit (`createdAt`) to now. */
  jobEnded(agent: string, outcome: string, createdAt: string): void {
    this.jobSeconds.observe({ agent, outcome }, Math.max(0, Date.now() - Date.parse(createdAt)) / 1000);
  }

  attemptEnded(
    agent: string,
    pool: string,
    outcome: string,
    spent: { ms: number; cpuMs: number | undefined; artifactBytes: number },
  ): void {
    this.attempts.inc({ agent, pool, outcome });
    this.attemptSeconds.observe({ agent, pool, outcome }, spent.ms / 1000);
    if (spent.cpuMs !== undefined) this.cpuSeconds.inc({ agent }, spent.cpuMs / 1000);
    if (spent.artifactBytes > 0) this.artifactBytes.inc({ agent }, spent.artifactBytes);
  }
}
