export type { Identity, SubjectPermissions } from "./access.js";
export {
  callerOf,
  intakeSubjectParts,
  mayAccess,
  mayReplyTo,
  OPEN_IDENTITY,
  ownerOf,
  parseIdentity,
  permissionsTable,
  ROLE_ENDPOINTS,
  ROLE_TAG,
  ROLES,
  Role,
  rolePermissions,
  seesAll,
  USER_TEMPLATE,
  UserName,
} from "./access.js";
export type { AgentDefinitionInput } from "./agent.js";
export {
  AgentDefinition,
  AgentName,
  credentialLikeEnv,
  MAX_TIMEOUT_MS,
  NetworkWish,
  OutputGlob,
  PoolName,
  PROTOCOL_VERSION,
  ResourceLimits,
  RetryOn,
  RetryPolicy,
  RuntimeWishes,
  SandboxKind,
  SecretRef,
} from "./agent.js";
export {
  AgentRef,
  API_CONTRACT,
  ApiReply,
  type ApiReplyData,
  ApplyAgentReply,
  ArtifactChunk,
  ArtifactRequest,
  apiEndpointMetadata,
  apiSchemaFile,
  CleanJobsReply,
  CleanJobsRequest,
  CountJobsReply,
  CountJobsRequest,
  EventsPage,
  JobEventsRequest,
  JobLogsRequest,
  JobRef,
  JobReply,
  ListAgentsReply,
  ListJobsReply,
  ListJobsRequest,
  ListRunsReply,
  ListRunsRequest,
  ListWorkersReply,
  LogsPage,
  PolicyReply,
  RunEventsRequest,
  RunRef,
  RunReply,
  SetPolicyReply,
  StartRunReply,
  StartRunRequest,
  SubmitReply,
  UPLOAD_END_HEADER,
  UploadDone,
  UploadReply,
  UploadRequest,
} from "./api.js";
export { maskUrl, NATS_CONNECTION_ENV, NatsConnectionSettings } from "./connection.js";
export type { DocTable } from "./doc-tables.js";
export { docTableMarkers, docTableRegion, docTables, writeDocTable } from "./doc-tables.js";
export {
  BoxcarError,
  decodeMessage,
  ERROR_STATUS,
  ErrorCode,
  ErrorInfo,
  ErrorIssue,
  formatPath,
  issuesUnder,
  parseWith,
  toErrorInfo,
  ValidationError,
  zodIssues,
} from "./errors.js";
export {
  BoxcarEvent,
  JobEvent,
  JobEventType,
  SandboxEvent,
  SandboxEventType,
  SessionEvent,
  SessionEventType,
  unfoldEvents,
  WorkerEvent,
  WorkerEventType,
  WorkflowEvent,
  WorkflowEventType,
} from "./events.js";
export type { JobSpecInput } from "./job.js";
export {
  AgentResultFile,
  Artifact,
  AttemptOutcome,
  handoffPending,
  InputFileRef,
  inputObjectPrefix,
  isTerminal,
  JobRecord,
  JobResult,
  JobSpec,
  JobState,
  MAX_INPUT_FILES,
  MAX_SPEC_BYTES,
  ResourceUsage,
  SandboxInfo,
  TERMINAL_STATES,
  WORK_ITEM_VERSION,
  WorkItem,
  WorkspacePath,
} from "./job.js";
export * as JobTransitions from "./job-transitions.js";
export { jsonSchemas } from "./json-schemas.js";
export type { EventKind, Names } from "./names.js";
export { ApiEndpoint, DEFAULT_PREFIX, LOCAL_OWNER, LogStream, names, TOKEN_PATTERN } from "./names.js";
export type { AgentPolicyInput, SystemPolicyInput } from "./policy.js";
export {
  AgentPolicy,
  checkAgentPolicy,
  DEFAULT_QUEUE_LIMITS,
  DEFAULT_RETENTION_MS,
  policyViolations,
  QueueLimits,
  Quota,
  quotaOf,
  Retention,
  retentionOf,
  SystemPolicy,
} from "./policy.js";
export { PRIORITIES, Priority } from "./priority.js";
export type { ResolvedRuntime, RuntimePolicyInput } from "./runtime.js";
export { ISOLATION_ORDER, RuntimePolicy, resolveRuntime, SandboxBackend } from "./runtime.js";
export type {
  ExecRequest as ExecRequestInput,
  ListSessionsRequest as ListSessionsRequestInput,
  OpenSessionRequest as OpenSessionRequestInput,
} from "./session.js";
export {
  ExecReply,
  ExecRequest,
  ListSessionsReply,
  ListSessionsRequest,
  MAX_EXEC_REPLY_OUTPUT,
  OpenSessionRequest,
  SessionId,
  SessionRecord,
  SessionRef,
  SessionReply,
  SessionState,
  WorkerOpenSession,
  WorkerReply,
} from "./session.js";
export { evaluate, parseExpression, render, TemplateError, truthy } from "./template.js";
export { durationMs, parseDurationMs, parseSizeBytes, sizeBytes } from "./units.js";
export { WorkerConfig } from "./worker-config.js";
export {
  goneAfterMs,
  InFlightFate,
  InFlightJob,
  inFlightFate,
  isLive,
  MISSED_HEARTBEATS,
  WorkerInfo,
  WorkerState,
  WorkerStatus,
  WorkerView,
  whyCannotServe,
  workerStatus,
  workerViews,
} from "./worker-info.js";
export type { WorkflowDefinitionInput } from "./workflow.js";
export {
  ChainEntry,
  ChainLimits,
  ChainLink,
  DEFAULT_CHAIN_LIMITS,
  HandoffDecision,
  HandoffRequest,
  isRunFinal,
  MAX_FAN_OUT,
  RunState,
  StepInstance,
  StepName,
  StepRun,
  StepState,
  WorkflowDefinition,
  WorkflowRun,
  WorkflowStep,
} from "./workflow.js";
export type { FileIssue } from "./yaml-file.js";
export { FileError, locateYamlPath, parseAgentFile, parsePolicyFile, parseWorkflowFile, parseYamlFile } from "./yaml-file.js";
