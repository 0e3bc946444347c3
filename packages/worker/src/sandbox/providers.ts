import type { WorkerConfig } from "@boxcar/protocol";
import { createDockerSandboxProvider } from "./docker/docker-sandbox.js";
import { createE2BSandboxProvider } from "./e2b/e2b-sandbox.js";
import { createHostSandboxProvider } from "./host/host-sandbox.js";
import type { SandboxProvider } from "./sandbox.js";

export type SandboxConfig = NonNullable<WorkerConfig["sandbox"]>;

export interface ProviderContext {
  /** The Boxcar prefix: containers are labelled with it. */
  prefix: string;
  /** The system's identity (`Topology.systemId`): containers are labelled with it too. */
  system?: string;
  /** Where workspaces are staged on this machine. */
  workRoot: string;
  /** Where secrets such as the E2B API key are read from. */
  env: Readonly<Record<string, string | undefined>>;
}

/**
 * The sandbox backends a worker has: always host and Docker (offered only while an engine
 * answers), and E2B when its API key is in the environment; each configured from the worker
 * config's `sandbox` section.
 */
export function sandboxProviders(config: SandboxConfig, ctx: ProviderContext): SandboxProvider[] {
  const docker = config.docker ?? {};
  const limits = docker.limits ?? {};
  const e2b = config.e2b;
  const e2bKey = ctx.env[e2b?.apiKeyEnv ?? "E2B_API_KEY"];
  return [
    createHostSandboxProvider({
      root: ctx.workRoot,
      ...(ctx.system ? { system: ctx.system } : {}),
      ...(config.hostUser ? { user: parseUser(config.hostUser) } : {}),
    }),
    createDockerSandboxProvider({
      prefix: ctx.prefix,
      ...(ctx.system ? { system: ctx.system } : {}),
      root: ctx.workRoot,
      ...(docker.image ? { defaultImage: docker.image } : {}),
      ...(docker.user ? { user: docker.user } : {}),
      defaultLimits: { cpus: limits.cpus ?? 1, memory: limits.memory ?? 1024 ** 3, pids: limits.pids ?? 256 },
      ...(docker.tmpSize ? { tmpBytes: docker.tmpSize } : {}),
      ...(docker.maxWorkspace ? { maxWorkspaceBytes: docker.maxWorkspace } : {}),
      ...(docker.maxWorkspaceEntries ? { maxWorkspaceEntries: docker.maxWorkspaceEntries } : {}),
      ...(docker.workspace ? { workspace: docker.workspace } : {}),
      ...(docker.warm ? { warm: docker.warm } : {}),
    }),
    ...(e2bKey
      ? [
          createE2BSandboxProvider({
            apiKey: e2bKey,
            prefix: ctx.prefix,
            ...(ctx.system ? { system: ctx.system } : {}),
            ...(e2b?.template ? { defaultTemplate: e2b.template } : {}),
            ...(e2b?.domain ? { domain: e2b.domain } : {}),
            ...(e2b?.apiUrl ? { apiUrl: e2b.apiUrl } : {}),
            ...(e2b?.sandboxUrl ? { sandboxUrl: e2b.sandboxUrl } : {}),
            ...(e2b?.timeoutMargin !== undefined ? { timeoutMarginMs: e2b.timeoutMargin } : {}),
          }),
        ]
      : []),
  ];
}

/** `uid:gid`, as the worker config's `sandbox.hostUser` holds it (checked by its schema). */
function parseUser(text: string): { uid: number; gid: number } {
  const [uid, gid] = text.split(":").map(Number);
  return { uid: uid ?? 0, gid: gid ?? 0 };
}
