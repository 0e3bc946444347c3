import type { WorkerConfig } from "@boxcar/protocol";
import { createDockerSandboxProvider } from "./docker-sandbox.js";
import { createHostSandboxProvider } from "./host-sandbox.js";
import type { SandboxProvider } from "./sandbox.js";

export type SandboxConfig = NonNullable<WorkerConfig["sandbox"]>;

export interface ProviderContext {
  /** The Boxcar prefix: containers are labelled with it. */
  prefix: string;
  /** Where workspaces are staged on this machine. */
  workRoot: string;
  /** Where secrets such as the E2B API key are read from. */
  env: Readonly<Record<string, string | undefined>>;
}

/**
 * The sandbox backends a worker has: always host and Docker (offered only while an engine
 * answers), each configured from the worker config's `sandbox` section.
 */
export function sandboxProviders(config: SandboxConfig, ctx: ProviderContext): SandboxProvider[] {
  const docker = config.docker ?? {};
  const limits = docker.limits ?? {};
  return [
    createHostSandboxProvider({ root: ctx.workRoot }),
    createDockerSandboxProvider({
      prefix: ctx.prefix,
      root: ctx.workRoot,
      ...(docker.image ? { defaultImage: docker.image } : {}),
      ...(docker.user ? { user: docker.user } : {}),
      defaultLimits: { cpus: limits.cpus ?? 1, memory: limits.memory ?? 1024 ** 3, pids: limits.pids ?? 256 },
      ...(docker.tmpSize ? { tmpBytes: docker.tmpSize } : {}),
      ...(docker.maxWorkspace ? { maxWorkspaceBytes: docker.maxWorkspace } : {}),
    }),
  ];
}
