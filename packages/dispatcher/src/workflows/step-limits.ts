import type { AgentDefinition, JobSpecInput, StepLimits, WorkflowStep } from "@boxcar/protocol";

/** The limits a workflow step sets, which its whole handoff chain carries; undefined when it sets none. */
export function stepLimitsOf(step: WorkflowStep | undefined): StepLimits | undefined {
  if (!step) return undefined;
  const limits: StepLimits = {
    ...(step.retry ? { retry: step.retry } : {}),
    ...(step.timeout !== undefined ? { timeout: step.timeout } : {}),
    ...(step.queueTimeout !== undefined ? { queueTimeout: step.queueTimeout } : {}),
    ...(step.pool ? { pool: step.pool } : {}),
  };
  return Object.keys(limits).length > 0 ? limits : undefined;
}

/**
 * What a job of a step's chain (its first or any hop) runs under when it runs `agent`: the step's
 * retry and pool, and the shorter of the step's and the agent's own time limits, so an agent may
 * tighten a step's limit and never loosen it.
 */
export function withinStep(
  limits: StepLimits | undefined,
  agent: AgentDefinition,
): Pick<JobSpecInput, "retry" | "timeout" | "queueTimeout" | "pool"> {
  if (!limits) return {};
  const own = agent.runtime.queueTimeout;
  return {
    ...(limits.retry ? { retry: limits.retry } : {}),
    ...(limits.timeout !== undefined ? { timeout: Math.min(limits.timeout, agent.runtime.timeout) } : {}),
    ...(limits.queueTimeout !== undefined
      ? { queueTimeout: own === undefined ? limits.queueTimeout : Math.min(limits.queueTimeout, own) }
      : {}),
    ...(limits.pool ? { pool: limits.pool } : {}),
  };
}
