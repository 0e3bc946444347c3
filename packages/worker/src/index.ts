export type { CallLimiter } from "./gateway/call-limits.js";
export { kvCallLimiter } from "./gateway/call-limits.js";
export type { AttemptAccess, CallRecorder, GatewayOptions, GatewayPass, ProviderAccess, RecordedAnswer } from "./gateway/gateway.js";
export { ModelGateway } from "./gateway/gateway.js";
export { Checkpoints, type LoopState } from "./harness/checkpoint.js";
export { type PromptLoopContext, type PromptLoopEnd, runPromptLoop } from "./harness/prompt-loop.js";
export { MAX_ARTIFACTS } from "./run/agent-workspace.js";
export { MAX_LOG_CHUNK } from "./run/output-log.js";
export { MAX_PROGRESS_CHARS } from "./run/progress-lines.js";
export type { Confinement } from "./sandbox/docker/container-config.js";
export { CONTAINER_WORKSPACE, ContainerLabel, hardenedHostConfig } from "./sandbox/docker/container-config.js";
export type { DockerSandboxOptions } from "./sandbox/docker/docker-sandbox.js";
export { createDockerSandboxProvider } from "./sandbox/docker/docker-sandbox.js";
export type { E2BSandboxOptions, ResolvedE2BSandboxOptions } from "./sandbox/e2b/e2b-options.js";
export { resolveE2BSandboxOptions } from "./sandbox/e2b/e2b-options.js";
export { createE2BSandboxProvider, E2BMetadata } from "./sandbox/e2b/e2b-sandbox.js";
export type { HostSandboxOptions } from "./sandbox/host/host-sandbox.js";
export { createHostSandboxProvider } from "./sandbox/host/host-sandbox.js";
export { AttemptLease } from "./sandbox/lifeline.js";
export type { ProviderContext, SandboxConfig } from "./sandbox/providers.js";
export { sandboxProviders } from "./sandbox/providers.js";
export type {
  ExecOptions,
  ExecResult,
  Sandbox,
  SandboxBackend,
  SandboxOwner,
  SandboxProvider,
  SandboxSpec,
} from "./sandbox/sandbox.js";
export { orphanCheck } from "./sandbox/sandbox-reaper.js";
export type { Worker, WorkerLifecycleState } from "./worker.js";
export { createWorker } from "./worker.js";
export { WorkerMetrics } from "./worker-metrics.js";
export type { ResolvedWorkerOptions, WorkerOptions } from "./worker-options.js";
export { resolveWorkerOptions, workerOptionsFromConfig } from "./worker-options.js";
export type { AgentEnvParams } from "./workspace/agent-contract.js";
export { AgentPaths, agentEnv, collectSecrets, MAX_RESULT_BYTES } from "./workspace/agent-contract.js";
export type { WorkspaceFile } from "./workspace/files.js";
export { globMatcher, globToRegExp } from "./workspace/glob.js";
export { WorkspaceRoot, workspaceOwnerOf } from "./workspace/local-workspace.js";
export { REDACTED } from "./workspace/redactor.js";
export { defaultWorkRoot } from "./workspace/work-root.js";
