/**
 * The protocol's internal entry (`@boxcar/protocol/internal`): everything of the public entry,
 * and the logic the roles (fabric, dispatcher, worker) share on top of the wire: a job's
 * transitions, access checks, policy and usage arithmetic, templates, the runtime's resolution.
 * Nothing a client needs is here only; the SDK, the CLI and the dashboard import the public entry.
 */

export {
  callerOf,
  intakeSubjectParts,
  mayAccess,
  mayReplyTo,
  permissionsTable,
  type SubjectPermissions,
  seesAll,
  USER_TEMPLATE,
} from "./access.js";
export { credentialLikeEnv } from "./agent.js";
export { checkInput } from "./agent-input.js";
export { apiEndpointMetadata } from "./api.js";
export { type DocTable, writeDocTable } from "./doc-tables.js";
export { decodeMessage, ERROR_STATUS, issuesUnder } from "./errors.js";
export * from "./index.js";
export { inputObjectPrefix, MAX_DELAY_MS, POOL_PLACE_PREFIX, placesOf, TOTAL_PLACE } from "./job.js";
export { jobEvent } from "./job-event.js";
export type { JobStep } from "./job-transitions.js";
export * as JobTransitions from "./job-transitions.js";
export { checkAgentPolicy, DEFAULT_QUEUE_LIMITS, POLICY_KEY, policyViolations, priceOf, quotaOf, retentionOf } from "./policy.js";
export { modelOf, modelsOfAgent, STEP_EXCERPT } from "./prompt-agent.js";
export { resolveRuntime } from "./runtime.js";
export {
  keptOutputObject,
  keptOutputSizes,
  MAX_BACKGROUND_PROCESSES,
  MAX_ENDED_PROCESSES,
  MAX_EXEC_REPLY_OUTPUT,
  MAX_KEPT_OUTPUT,
  MAX_SESSION_REQUEST_BYTES,
  MAX_SESSION_TUNNELS,
  MAX_SESSION_WATCHES,
  SESSION_OUTPUT_SEGMENT,
} from "./session.js";
export { evaluate, parseExpression, render, TemplateError, truthy } from "./template.js";
export { durationMs, sizeBytes } from "./units.js";
export { addUsage, MODEL_NAME, NO_USAGE, parseUsageEntry, spent, usageDay, usageKey, usageOf } from "./usage.js";
export { inFlightFate, modelsRefusal, whyCannotServe } from "./worker-info.js";
export { goneAfterMs, isLive } from "./worker-status.js";
export { DEFAULT_CHAIN_LIMITS, MAX_FAN_OUT } from "./workflow.js";
