/**
 * The E2B backend's options (`E2BSandboxOptions`): the worker's API key and E2B's addresses, the
 * default template, the margin a sandbox outlives its job by, the workspace's path, the names
 * that mark this system's sandboxes; their defaults and checks (`resolveE2BSandboxOptions`).
 */

import { BoxcarError, ErrorCode } from "@boxcar/protocol";

export interface E2BSandboxOptions {
  /**
   * The worker's E2B API key, e.g. `E2B_API_KEY` from its environment; never a job's. Without
   * one the backend is not offered (`available()` is false).
   */
  apiKey?: string;
  /** E2B's domain, e.g. of a self-hosted E2B; default the SDK's (`E2B_DOMAIN`, else `e2b.app`). */
  domain?: string;
  /** The control-plane API; default the SDK's (`E2B_API_URL`, else `https://api.<domain>`). */
  apiUrl?: string;
  /** One URL for every sandbox's daemon; default the SDK's (`E2B_SANDBOX_URL`, else per-sandbox hosts). */
  sandboxUrl?: string;
  /** Template for agents that name none; default `base`. */
  defaultTemplate?: string;
  /**
   * How long a sandbox outlives its job's time limit: its own E2B timeout, a backstop that ends
   * it should the worker vanish. Counted from creation and again from the agent's start; it
   * also covers copying files in and out. Default 300000 ms.
   */
  timeoutMarginMs?: number;
  /**
   * The workspace inside the sandbox: an absolute path, or one relative to the sandbox user's
   * home. Default `workspace`, which is `/home/user/workspace` on E2B's templates.
   */
  workspace?: string;
  /**
   * Names this Boxcar system in its sandboxes' metadata, so `reap` removes only its own
   * sandboxes. Without it the provider has no `reap`.
   */
  prefix?: string;
  /**
   * The system's identity (`Topology.systemId`), also in the metadata: `reap` leaves alone the
   * sandboxes of another system that shares the prefix (and the E2B account).
   */
  system?: string;
  /** PATH the agent gets; default the Debian one E2B's templates use. */
  agentPath?: string;
  /** How long a killed agent may take to report its end before the run stops waiting; default 10000 ms. */
  killGraceMs?: number;
}

export interface ResolvedE2BSandboxOptions {
  apiKey: string | undefined;
  domain: string | undefined;
  apiUrl: string | undefined;
  sandboxUrl: string | undefined;
  defaultTemplate: string;
  timeoutMarginMs: number;
  workspace: string;
  prefix: string | undefined;
  system: string | undefined;
  agentPath: string;
  killGraceMs: number;
}

const DEFAULT_AGENT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** Fills in defaults and checks every option; throws an `invalid` error naming the bad one. */
export function resolveE2BSandboxOptions(opts: E2BSandboxOptions): ResolvedE2BSandboxOptions {
  const resolved: ResolvedE2BSandboxOptions = {
    apiKey: opts.apiKey || undefined,
    domain: opts.domain || undefined,
    apiUrl: opts.apiUrl || undefined,
    sandboxUrl: opts.sandboxUrl || undefined,
    defaultTemplate: opts.defaultTemplate ?? "base",
    timeoutMarginMs: opts.timeoutMarginMs ?? 300_000,
    workspace: opts.workspace ?? "workspace",
    prefix: opts.prefix || undefined,
    system: opts.system || undefined,
    agentPath: opts.agentPath ?? DEFAULT_AGENT_PATH,
    killGraceMs: opts.killGraceMs ?? 10_000,
  };
  const bad = (what: string) => new BoxcarError(ErrorCode.invalid, `E2B sandbox options: ${what}`);
  if (!resolved.defaultTemplate) throw bad("defaultTemplate must not be empty");
  if (!Number.isInteger(resolved.timeoutMarginMs) || resolved.timeoutMarginMs < 0) throw bad("timeoutMarginMs must be a whole number ≥ 0");
  if (!Number.isInteger(resolved.killGraceMs) || resolved.killGraceMs < 0) throw bad("killGraceMs must be a whole number ≥ 0");
  const ws = resolved.workspace;
  if (!ws || ws.includes("\0") || ws.split("/").includes("..") || ws === "/") {
    throw bad("workspace must be a folder path without '..', absolute or relative to the sandbox user's home");
  }
  for (const [name, url] of [
    ["apiUrl", resolved.apiUrl],
    ["sandboxUrl", resolved.sandboxUrl],
  ] as const) {
    if (url !== undefined && !URL.canParse(url)) throw bad(`${name} ${JSON.stringify(url)} is not a URL`);
  }
  return resolved;
}
