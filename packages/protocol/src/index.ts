export type { SubjectPermissions } from "./access.js";
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
export { checkInput, InputSchema } from "./agent-input.js";
export {
  AgentRef,
  API_CONTRACT,
  ApiReply,
  type ApiReplyData,
  ApplyAgentReply,
  ApproveStepRequest,
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
  MAX_SIGNALS,
  PolicyReply,
  RunEventsRequest,
  RunRef,
  RunReply,
  RunSignalReply,
  SetPolicyReply,
  SIGNALS_DIR,
  SignalReply,
  SignalRequest,
  StartRunReply,
  StartRunRequest,
  SubmitReply,
  signalFile,
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
export { unfoldEvents } from "./event-fold.js";
export {
  BoxcarEvent,
  JobEvent,
  JobEventType,
  SandboxEvent,
  SandboxEventType,
  SessionEvent,
  SessionEventType,
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
  limitNamed,
  MAX_DELAY_MS,
  MAX_INPUT_FILES,
  MAX_SPEC_BYTES,
  POOL_PLACE_PREFIX,
  placesOf,
  ResourceUsage,
  SandboxInfo,
  TERMINAL_STATES,
  TOTAL_PLACE,
  WORK_ITEM_VERSION,
  WorkItem,
  WorkspacePath,
} from "./job.js";
export * as JobTransitions from "./job-transitions.js";
export { jsonSchemas } from "./json-schemas.js";
export { AgentModels, MODEL_PROVIDERS, ModelCall, ModelProvider, recordedCallObject } from "./models.js";
export type { EventKind, Names } from "./names.js";
export { ApiEndpoint, DEFAULT_PREFIX, LOCAL_OWNER, LogStream, names, TOKEN_PATTERN } from "./names.js";
export type { AgentPolicyInput, SystemPolicyInput } from "./policy.js";
export {
  AgentPolicy,
  checkAgentPolicy,
  DEFAULT_QUEUE_LIMITS,
  DEFAULT_RETENTION_MS,
  ModelLimit,
  ModelPrice,
  POLICY_KEY,
  policyViolations,
  priceOf,
  QueueLimits,
  Quota,
  quotaOf,
  Retention,
  retentionOf,
  SystemPolicy,
} from "./policy.js";
export type { Identity } from "./principal.js";
export { ROLES, Role } from "./principal.js";
export { PRIORITIES, Priority } from "./priority.js";
export {
  BUILTIN_TOOLS,
  BuiltinTool,
  HarnessStep,
  harnessObjects,
  ModelRef,
  modelOf,
  modelsOfAgent,
  PromptAgent,
  STEP_EXCERPT,
} from "./prompt-agent.js";
export { type PromptFile, parsePromptFile } from "./prompt-file.js";
export type { ResolvedRuntime, RuntimePolicyInput } from "./runtime.js";
export { ISOLATION_ORDER, RuntimePolicy, resolveRuntime, SandboxBackend } from "./runtime.js";
export {
  ListSchedulesReply,
  ScheduleDefinition,
  type ScheduleDefinitionInput,
  ScheduleName,
  ScheduleRecord,
  ScheduleRef,
  ScheduleReply,
  ScheduleState,
} from "./schedule.js";
export type {
  ExecRequest as ExecRequestInput,
  ListSessionFiles as ListSessionFilesInput,
  ListSessionsRequest as ListSessionsRequestInput,
  OpenSessionRequest as OpenSessionRequestInput,
  WriteSessionFile as WriteSessionFileInput,
} from "./session.js";
export {
  ExecReply,
  ExecRequest,
  GitSeed,
  ListSessionFiles,
  ListSessionsReply,
  ListSessionsRequest,
  MAX_EXEC_REPLY_OUTPUT,
  MAX_EXEC_STDIN,
  MAX_SESSION_FILE_BYTES,
  MAX_SESSION_REQUEST_BYTES,
  OpenSessionRequest,
  SessionFileRef,
  SessionId,
  SessionRecord,
  SessionRef,
  SessionReply,
  SessionState,
  SnapshotId,
  SnapshotInfo,
  WorkerOpenSession,
  WorkerReply,
  WriteSessionFile,
} from "./session.js";
export { evaluate, parseExpression, render, TemplateError, truthy } from "./template.js";
export { durationMs, parseDurationMs, parseSizeBytes, sizeBytes } from "./units.js";
export {
  addUsage,
  Budget,
  MODEL_NAME,
  NO_USAGE,
  parseUsageEntry,
  spent,
  Usage,
  UsageLine,
  UsageReply,
  UsageRequest,
  usageDay,
  usageKey,
  usageOf,
} from "./usage.js";
export { WorkerConfig } from "./worker-config.js";
export {
  InFlightFate,
  InFlightJob,
  inFlightFate,
  WorkerInfo,
  WorkerState,
  WorkerStatus,
  WorkerView,
  whyCannotServe,
  workerViews,
} from "./worker-info.js";
export { goneAfterMs, isLive, MISSED_HEARTBEATS, workerStatus } from "./worker-status.js";
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
  StepLimits,
  StepName,
  StepRun,
  StepState,
  WorkflowDefinition,
  WorkflowRun,
  WorkflowStep,
} from "./workflow.js";
export type { FileIssue } from "./yaml-file.js";
export { FileError, locateYamlPath, parseAgentFile, parsePolicyFile, parseWorkflowFile, parseYamlFile } from "./yaml-file.js";
