/**
 * The protocol's public entry (`@boxcar/protocol`): the wire, as any client sees it. The zod
 * schemas and types of every message, record, event and file, the names of subjects, streams and
 * buckets, the errors and their codes, and the few functions a client needs to read them. The
 * roles' shared logic (a job's transitions, access checks, policy and usage arithmetic) is in the
 * internal entry, `@boxcar/protocol/internal` (internal.ts), which re-exports this one.
 */
export { OPEN_IDENTITY, ownerOf, parseIdentity, READ_ENDPOINTS, ROLE_ENDPOINTS, ROLE_TAG, rolePermissions, UserName } from "./access.js";
export type { AgentDefinitionInput } from "./agent.js";
export {
  AgentDefinition,
  AgentName,
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
export { InputSchema } from "./agent-input.js";
export {
  AgentRef,
  API_CONTRACT,
  ApiReply,
  type ApiReplyData,
  ApplyAgentReply,
  ApproveStepRequest,
  ArtifactChunk,
  ArtifactRequest,
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
  KeptJob,
  KeptReason,
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
export { docTableMarkers, docTableRegion, docTables } from "./doc-tables.js";
export { BoxcarError, ErrorCode, ErrorInfo, ErrorIssue, formatPath, parseWith, toErrorInfo, ValidationError, zodIssues } from "./errors.js";
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
  isTerminal,
  JobRecord,
  JobResult,
  JobSpec,
  JobState,
  limitNamed,
  MAX_INPUT_FILES,
  MAX_SPEC_BYTES,
  ResourceUsage,
  SandboxInfo,
  TERMINAL_STATES,
  WORK_ITEM_VERSION,
  WorkItem,
  WorkspacePath,
} from "./job.js";
export { jsonSchemas } from "./json-schemas.js";
export { AgentModels, GatewayReach, MODEL_PROVIDERS, ModelCall, ModelProvider, recordedCallObject } from "./models.js";
export type { EventKind, Names } from "./names.js";
export { ApiEndpoint, DEFAULT_PREFIX, LOCAL_OWNER, LogStream, names, TOKEN_PATTERN, TunnelWay } from "./names.js";
export type { AgentPolicyInput, SystemPolicyInput } from "./policy.js";
export { AgentPolicy, DEFAULT_RETENTION_MS, ModelLimit, ModelPrice, QueueLimits, Quota, Retention, SystemPolicy } from "./policy.js";
export type { Identity } from "./principal.js";
export { ROLES, Role } from "./principal.js";
export { PRIORITIES, Priority } from "./priority.js";
export { BUILTIN_TOOLS, BuiltinTool, HarnessStep, harnessObjects, ModelRef, PromptAgent } from "./prompt-agent.js";
export { type PromptFile, parsePromptFile } from "./prompt-file.js";
export type { ResolvedRuntime, RuntimePolicyInput } from "./runtime.js";
export { ISOLATION_ORDER, RuntimePolicy, SandboxBackend } from "./runtime.js";
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
  ConnectRequest as ConnectRequestInput,
  ExecRequest as ExecRequestInput,
  ListSessionFiles as ListSessionFilesInput,
  ListSessionsRequest as ListSessionsRequestInput,
  OpenSessionRequest as OpenSessionRequestInput,
  OutputRequest as OutputRequestInput,
  PauseRequest as PauseRequestInput,
  ReadSessionFile as ReadSessionFileInput,
  ShellRequest as ShellRequestInput,
  StartRequest as StartRequestInput,
  WaitRequest as WaitRequestInput,
  WatchRequest as WatchRequestInput,
  WriteSessionFile as WriteSessionFileInput,
} from "./session.js";
export {
  ConnectReply,
  ConnectRequest,
  ExecReply,
  ExecRequest,
  GitSeed,
  InputRequest,
  KeptOutput,
  ListSessionFiles,
  ListSessionsReply,
  ListSessionsRequest,
  MAX_EXEC_STDIN,
  MAX_OUTPUT_READ,
  MAX_PROCESS_INPUT,
  MAX_SESSION_FILE_BYTES,
  OpenSessionRequest,
  OutputReply,
  OutputRequest,
  OutputStream,
  PauseRequest,
  Port,
  ProcessesReply,
  ProcessInfo,
  ProcessRef,
  ProcessReply,
  ReadSessionFile,
  SESSION_FILES_QUOTA,
  SessionFileRef,
  SessionFileStat,
  SessionId,
  SessionRecord,
  SessionRef,
  SessionReply,
  SessionState,
  SessionTemplate,
  SessionTemplateName,
  ShellReply,
  ShellRequest,
  SnapshotId,
  SnapshotInfo,
  StartRequest,
  StatSessionFile,
  TUNNEL_CHUNK,
  TUNNEL_WINDOW,
  TunnelId,
  TunnelInfo,
  WaitReply,
  WaitRequest,
  WatchInfo,
  WatchRef,
  WatchRequest,
  WorkerConnect,
  WorkerOpenSession,
  WorkerReply,
  WorkerShell,
  WriteSessionFile,
} from "./session.js";
export { parseDurationMs, parseSizeBytes } from "./units.js";
export { Budget, Usage, UsageLine, UsageReply, UsageRequest } from "./usage.js";
export { WorkerConfig } from "./worker-config.js";
export { InFlightFate, InFlightJob, WorkerInfo, WorkerState, WorkerStatus, WorkerView, workerViews } from "./worker-info.js";
export { MISSED_HEARTBEATS, workerStatus } from "./worker-status.js";
export type { WorkflowDefinitionInput } from "./workflow.js";
export {
  ChainEntry,
  ChainLimits,
  ChainLink,
  HandoffDecision,
  HandoffRequest,
  isRunFinal,
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
