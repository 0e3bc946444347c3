import type { Topology } from "@boxcar/fabric";
import { BoxcarError, type JobState, type Usage } from "@boxcar/protocol";
import { Counter, Gauge, type Registry } from "prom-client";

/** What a dispatcher does to a job apart from admitting it: each is counted, by agent. */
export type JobAction = "cancel" | "retry" | "rerun" | "expire" | "timed_out" | "dead";

/**
 * A dispatcher's Prometheus metrics (docs/observability.md), registered in the registry the
 * caller serves. The counters are this dispatcher's own; the gauges are the whole system's as it
 * sees them (every dispatcher reports the same), read when scraped. Labels are bounded: agent
 * and pool names, states, priorities and error codes, never job ids or users.
 */
export class DispatcherMetrics {
  private readonly admitted: Counter<"agent" | "pool">;
  private readonly refused: Counter<"code">;
  private readonly actions: Counter<"action" | "agent">;
  private readonly tokens: Counter<"agent" | "direction">;
  private readonly cost: Counter<"agent">;
  /** Each workflow run's state, by id, from the dispatcher's watch of the runs (deleted runs go). */
  private readonly runs = new Map<string, string>();

  constructor(registry: Registry, topology: Topology, jobsByState: () => Record<JobState, number>) {
    const registers = [registry];
    this.admitted = new Counter({
      name: "boxcar_jobs_admitted_total",
      help: "Jobs this dispatcher admitted (submissions, intake, handoffs, workflow steps), by agent and pool",
      labelNames: ["agent", "pool"],
      registers,
    });
    this.refused = new Counter({
      name: "boxcar_admissions_refused_total",
      help: "Jobs this dispatcher refused to admit, by error code",
      labelNames: ["code"],
      registers,
    });
    this.tokens = new Counter({
      name: "boxcar_usage_tokens_total",
      help: "Tokens the agents' calls used, as they reported them, summed by this dispatcher (each report by one dispatcher), by agent and direction (in, out)",
      labelNames: ["agent", "direction"],
      registers,
    });
    this.cost = new Counter({
      name: "boxcar_usage_cost_total",
      help: "What the agents' calls cost, as they reported it, summed by this dispatcher (each report by one dispatcher), by agent",
      labelNames: ["agent"],
      registers,
    });
    this.actions = new Counter({
      name: "boxcar_dispatcher_job_actions_total",
      help: "What this dispatcher did to jobs apart from admitting them, by action (cancel and retry through the API; expire and timed_out when a job waited past its queue timeout or deadline; dead when JetStream gave up on its work item) and agent",
      labelNames: ["action", "agent"],
      registers,
    });
    new Gauge({
      name: "boxcar_jobs",
      help: "Jobs in the system by state, from this dispatcher's job index",
      labelNames: ["state"],
      registers,
      collect() {
        for (const [state, n] of Object.entries(jobsByState())) this.set({ state }, n);
      },
    });
    const runs = this.runs;
    new Gauge({
      name: "boxcar_workflow_runs",
      help: "Workflow runs in the system by state, from this dispatcher's watch of the runs",
      labelNames: ["state"],
      registers,
      collect() {
        this.reset();
        const counts = new Map<string, number>();
        for (const state of runs.values()) counts.set(state, (counts.get(state) ?? 0) + 1);
        for (const [state, n] of counts) this.set({ state }, n);
      },
    });
    new Gauge({
      name: "boxcar_queue_depth",
      help: "Work items waiting in a pool's queue, by priority (its JetStream consumer's pending count)",
      labelNames: ["pool", "priority"],
      registers,
      async collect() {
        this.reset();
        for await (const info of topology.jsm.consumers.list(topology.names.streams.work)) {
          const queue = topology.names.poolOfConsumer(info.name);
          if (queue) this.set(queue, info.num_pending);
        }
      },
    });
  }

  /** Counts one action on a job of `agent`. */
  jobAction(action: JobAction, agent: string): void {
    this.actions.inc({ action, agent });
  }

  /** An attempt's usage, summed into the day's by this dispatcher. */
  usage(agent: string, usage: Usage): void {
    this.tokens.inc({ agent, direction: "in" }, usage.tokensIn);
    this.tokens.inc({ agent, direction: "out" }, usage.tokensOut);
    this.cost.inc({ agent }, usage.cost);
  }

  /** A run's latest value (undefined: deleted), as the dispatcher's watch of the runs sees it. */
  observeRun(id: string, run: { state: string } | undefined): void {
    if (run) this.runs.set(id, run.state);
    else this.runs.delete(id);
  }

  /** Runs an admission, counting it as admitted or refused. */
  async admission<T extends { job: { agent: string; pool: string }; duplicate: boolean }>(admit: () => Promise<T>): Promise<T> {
    try {
      const admitted = await admit();
      if (!admitted.duplicate) this.admitted.inc({ agent: admitted.job.agent, pool: admitted.job.pool });
      return admitted;
    } catch (err) {
      if (err instanceof BoxcarError) this.refused.inc({ code: err.code });
      throw err;
    }
  }
}
