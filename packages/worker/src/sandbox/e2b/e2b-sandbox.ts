/**
 * The E2B backend's provider (`createE2BSandboxProvider`): E2B cloud sandboxes (Firecracker
 * microVMs) created through the official `e2b` SDK for a job's attempt or a session, marked with
 * this system's metadata (`E2BMetadata`), their network and limits checked against what E2B and
 * the template can give; and finding the sandboxes that are no longer anyone's (a job's earlier
 * attempts, a gone worker's). The sandbox itself is in e2b-job-sandbox.ts.
 */

import { posix } from "node:path";
import { BoxcarError, ErrorCode, type ResourceLimits } from "@boxcar/protocol";
import { ALL_TRAFFIC, E2B, type Sandbox as E2BRemoteSandbox } from "e2b";
import { raceAbort } from "../abort.js";
import type { SandboxOwner, SandboxProvider, SandboxSpec } from "../sandbox.js";
import { e2bError } from "./e2b-errors.js";
import { E2BSandbox } from "./e2b-job-sandbox.js";
import { type E2BSandboxOptions, resolveE2BSandboxOptions } from "./e2b-options.js";
import { E2BSession, seedRemote } from "./e2b-session.js";

/** Metadata keys on every E2B sandbox Boxcar creates. */
export const E2BMetadata = {
  prefix: "boxcarPrefix",
  system: "boxcarSystem",
  job: "boxcarJob",
  /** On a session's sandbox, in place of the job and attempt: the session it is kept for. */
  session: "boxcarSession",
  attempt: "boxcarAttempt",
  worker: "boxcarWorker",
  sandbox: "boxcarSandbox",
} as const;

/**
 * Sandboxes that are E2B cloud sandboxes (Firecracker microVMs), driven through the official
 * `e2b` SDK. Each job attempt gets its own sandbox, created from the agent's template with
 * metadata naming the attempt, killed when the attempt ends, and given an E2B timeout of the
 * job's time limit plus a margin as a backstop. See docs/e2b.md.
 */
export function createE2BSandboxProvider(opts: E2BSandboxOptions = {}): SandboxProvider {
  const settings = resolveE2BSandboxOptions(opts);
  // The SDK falls back to E2B_* variables for what is not given; debug is pinned off so
  // E2B_DEBUG can never make it skip the API.
  const client =
    settings.apiKey === undefined
      ? undefined
      : new E2B({
          apiKey: settings.apiKey,
          debug: false,
          ...(settings.domain ? { domain: settings.domain } : {}),
          ...(settings.apiUrl ? { apiUrl: settings.apiUrl } : {}),
          ...(settings.sandboxUrl ? { sandboxUrl: settings.sandboxUrl } : {}),
        });

  const provider: SandboxProvider = {
    kind: "e2b",
    // Configured is enough: asking E2B on every heartbeat would cost a call per worker per beat.
    available: async () => client !== undefined,

    async create(spec, signal) {
      return (await start(spec, { signal })).sandbox;
    },

    async createSession(spec, seed) {
      const { sandbox, remote } = await start(spec, { session: true });
      try {
        if (seed) await seedRemote(remote, sandbox.workspace, seed);
        // The session's lifetime counts from now, once it is ready (the seed took its time): its
        // worker closes it then, and E2B would end it a margin later.
        await sandbox.keepUntil(Date.now() + (spec.lifetimeMs ?? 0) + settings.timeoutMarginMs);
        return new E2BSession(sandbox, remote);
      } catch (err) {
        await sandbox.destroy().catch(() => {});
        throw err;
      }
    },
  };

  /** Creates an E2B sandbox for `spec` (a job's attempt, or a `session`'s) with its workspace made. */
  async function start(
    spec: SandboxSpec,
    { signal, session = false }: { signal?: AbortSignal | undefined; session?: boolean },
  ): Promise<{ sandbox: E2BSandbox; remote: E2BRemoteSandbox }> {
    if (!client) {
      throw new BoxcarError(ErrorCode.sandboxFailed, "this worker has no E2B API key: set E2B_API_KEY in the worker's environment");
    }
    signal?.throwIfAborted();
    const { runtime } = spec;
    const template = runtime.template ?? settings.defaultTemplate;
    const allowInternetAccess = internetAccess(runtime.network);
    if (runtime.limits.pids !== undefined) {
      throw new BoxcarError(
        ErrorCode.invalid,
        `runtime.limits.pids is ${runtime.limits.pids}, but E2B cannot limit the processes of a sandbox: remove the limit, or use a docker sandbox`,
      );
    }
    const lifetimeMs = (spec.lifetimeMs ?? runtime.timeout) + settings.timeoutMarginMs;
    const creating = client.Sandbox.create(template, {
      metadata: {
        ...(settings.prefix ? { [E2BMetadata.prefix]: settings.prefix } : {}),
        ...(settings.system ? { [E2BMetadata.system]: settings.system } : {}),
        ...(session
          ? { [E2BMetadata.session]: spec.jobId }
          : { [E2BMetadata.job]: spec.jobId, [E2BMetadata.attempt]: String(spec.attempt) }),
        [E2BMetadata.worker]: spec.workerId,
        [E2BMetadata.sandbox]: spec.id,
      },
      timeoutMs: lifetimeMs,
      // No internet but the hosts it must reach (the model gateway's): all traffic denied but theirs.
      ...(!allowInternetAccess && spec.egress?.length
        ? { network: { denyOut: [ALL_TRAFFIC], allowOut: spec.egress } }
        : { allowInternetAccess }),
    });
    let remote: E2BRemoteSandbox | undefined;
    try {
      remote = await raceAbort(creating, signal);
    } catch (err) {
      throw e2bError(err, `could not create an E2B sandbox from template ${template}`, { template });
    }
    if (!remote) {
      // Abandoned: the sandbox may still come into being; kill it as soon as it does.
      creating.then((late) => late.kill()).catch(() => {});
      signal?.throwIfAborted();
      throw new BoxcarError(ErrorCode.cancelled, "sandbox creation was abandoned");
    }
    const created = remote;
    try {
      const ready = await raceAbort(
        Promise.all([prepareWorkspace(created, settings.workspace), created.getInfo()]).catch((err: unknown) => {
          throw e2bError(err, `could not prepare E2B sandbox ${created.sandboxId}`);
        }),
        signal,
      );
      if (!ready) {
        signal?.throwIfAborted();
        throw new BoxcarError(ErrorCode.cancelled, "sandbox creation was abandoned");
      }
      const [workspace, info] = ready;
      const limits = templateLimits(template, runtime.limits, info);
      const sandbox = new E2BSandbox(spec.id, created, {
        workspace,
        agentPath: settings.agentPath,
        description: { image: template, network: runtime.network, limits },
        lifetimeMs,
        killGraceMs: settings.killGraceMs,
      });
      return { sandbox, remote: created };
    } catch (err) {
      await created.kill().catch(() => {});
      throw err;
    }
  }

  const { prefix, system } = settings;
  if (client) {
    // A new attempt kills its job's earlier attempts' sandboxes by id before its agent starts (a
    // frozen worker's, whose E2B timeout, the lease's stop time, has not come yet).
    provider.removeEarlierAttempts = async (jobId, attempt) => {
      let removed = 0;
      try {
        const query = { metadata: { [E2BMetadata.job]: jobId, ...(prefix ? { [E2BMetadata.prefix]: prefix } : {}) } };
        const pages = client.Sandbox.list({ query: { ...query, state: ["running", "paused"] } });
        while (pages.hasNext) {
          for (const info of await pages.nextItems()) {
            const theirs = info.metadata[E2BMetadata.system];
            if (theirs !== undefined && system !== undefined && theirs !== system) continue;
            if (Number(info.metadata[E2BMetadata.attempt]) >= attempt) continue;
            if (await client.Sandbox.kill(info.sandboxId)) removed += 1;
          }
        }
      } catch (err) {
        throw e2bError(err, `could not look for E2B sandboxes of job ${jobId}'s earlier attempts`);
      }
      return removed;
    };
  }
  if (client && prefix) {
    provider.reap = async (isOrphan) => {
      let removed = 0;
      try {
        const pages = client.Sandbox.list({ query: { metadata: { [E2BMetadata.prefix]: prefix }, state: ["running", "paused"] } });
        while (pages.hasNext) {
          for (const info of await pages.nextItems()) {
            // Another system's with the same prefix; one without the key is from an older worker.
            const theirs = info.metadata[E2BMetadata.system];
            if (theirs !== undefined && theirs !== system) continue;
            const owner = ownerOf(info.metadata);
            if (!owner || !(await isOrphan(owner))) continue;
            if (await client.Sandbox.kill(info.sandboxId)) removed += 1;
          }
        }
      } catch (err) {
        throw e2bError(err, "could not look for E2B sandboxes left by gone workers");
      }
      return removed;
    };
  }
  return provider;
}

/** Makes the workspace folder; a relative one is resolved against the sandbox user's home by the sandbox. */
async function prepareWorkspace(remote: E2BRemoteSandbox, workspace: string): Promise<string> {
  await remote.files.makeDir(workspace);
  return posix.isAbsolute(workspace) ? posix.normalize(workspace).replace(/\/$/, "") : (await remote.files.getInfo(workspace)).path;
}

/**
 * The agent's network wish as E2B's internet switch: `none` (the default) is no internet,
 * `bridge` is E2B's usual internet access. E2B has no named networks.
 */
function internetAccess(network: string): boolean {
  if (network === "none") return false;
  if (network === "bridge") return true;
  throw new BoxcarError(
    ErrorCode.invalid,
    `runtime.network ${network} is not available in E2B sandboxes: use none (no internet) or bridge (internet access)`,
  );
}

/**
 * The CPU and memory a template gives its sandboxes (E2B fixes them per template, not per
 * sandbox). A wish below them cannot be enforced and is refused; one at or above them holds.
 */
function templateLimits(template: string, wish: ResourceLimits, info: { cpuCount?: number; memoryMB?: number }): ResourceLimits {
  const limits: ResourceLimits = {};
  if (info.cpuCount) limits.cpus = info.cpuCount;
  if (info.memoryMB) limits.memory = info.memoryMB * 1024 * 1024;
  const refuse = (what: string, wanted: string, has: string) =>
    new BoxcarError(
      ErrorCode.invalid,
      `runtime.limits.${what} is ${wanted}, but E2B template ${template} gives its sandboxes ${has} and E2B cannot set less for one sandbox: use a template built with less, or raise or remove the limit`,
    );
  if (wish.cpus !== undefined && limits.cpus !== undefined && wish.cpus < limits.cpus) {
    throw refuse("cpus", String(wish.cpus), `${limits.cpus} CPUs`);
  }
  if (wish.memory !== undefined && limits.memory !== undefined && wish.memory < limits.memory) {
    throw refuse("memory", `${wish.memory} bytes`, `${limits.memory} bytes`);
  }
  return limits;
}

/** Whose a sandbox is, by its metadata: a session's is its worker's for as long as that worker lives (as a warm container is). */
function ownerOf(metadata: Record<string, string>): SandboxOwner | undefined {
  const jobId = metadata[E2BMetadata.job];
  const workerId = metadata[E2BMetadata.worker];
  if (metadata[E2BMetadata.session] !== undefined) return workerId ? { workerId } : undefined;
  const attempt = Number(metadata[E2BMetadata.attempt]);
  return jobId && workerId && Number.isInteger(attempt) ? { jobId, workerId, attempt } : undefined;
}
