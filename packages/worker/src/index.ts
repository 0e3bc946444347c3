export type { AgentEnvParams } from "./agent-contract.js";
export { AgentPaths, agentEnv, collectSecrets, MAX_RESULT_BYTES } from "./agent-contract.js";
export { MAX_ARTIFACTS } from "./agent-workspace.js";
export type { Confinement, DockerSandboxOptions } from "./docker-sandbox.js";
export { CONTAINER_WORKSPACE, ContainerLabel, createDockerSandboxProvider, hardenedHostConfig } from "./docker-sandbox.js";
export type { E2BSandboxOptions, ResolvedE2BSandboxOptions } from "./e2b-sandbox.js";
export { createE2BSandboxProvider, E2BMetadata, resolveE2BSandboxOptions } from "./e2b-sandbox.js";
export { globMatcher, globToRegExp } from "./glob.js";
export type { HostSandboxOptions } from "./host-sandbox.js";
export { createHostSandboxProvider } from "./host-sandbox.js";
export { AttemptLease } from "./lifeline.js";
export { WorkspaceRoot, workspaceOwnerOf } from "./local-workspace.js";
export { MAX_LOG_CHUNK } from "./output-log.js";
export { MAX_PROGRESS_CHARS } from "./progress-lines.js";
export type { ProviderContext, SandboxConfig } from "./providers.js";
export { sandboxProviders } from "./providers.js";
export { REDACTED } from "./redactor.js";
export type {
  ExecOptions,
  ExecResult,
  Sandbox,
  SandboxBackend,
  SandboxOwner,
  SandboxProvider,
  SandboxSpec,
  WorkspaceFile,
} from "./sandbox.js";
export { orphanCheck } from "./sandbox-reaper.js";
export { defaultWorkRoot } from "./work-root.js";
export type { Worker, WorkerLifecycleState } from "./worker.js";
export { createWorker } from "./worker.js";
export { WorkerMetrics } from "./worker-metrics.js";
export type { ResolvedWorkerOptions, WorkerOptions } from "./worker-options.js";
export { resolveWorkerOptions, workerOptionsFromConfig } from "./worker-options.js";
