import { z } from "zod";
import type { RuntimeWishes } from "./agent.js";
import { BoxcarError, ErrorCode } from "./errors.js";

export const SandboxBackend = z.enum(["host", "docker", "e2b"]);
export type SandboxBackend = z.infer<typeof SandboxBackend>;

/** Strongest isolation first: a micro-VM, a container, then a plain process. */
export const ISOLATION_ORDER: readonly SandboxBackend[] = ["e2b", "docker", "host"];

/**
 * Which sandboxes a worker may use, whatever it can offer. Host sandboxes isolate nothing:
 * `host` says for which agents they may be used (`trusted`: only agents whose definition says
 * `trusted: true`).
 */
export const RuntimePolicy = z.strictObject({
  allowed: z.array(SandboxBackend).default(["host", "docker", "e2b"]),
  /** The order `auto` tries backends in; default strongest isolation first. */
  prefer: z.array(SandboxBackend).default([...ISOLATION_ORDER]),
  host: z.enum(["never", "trusted", "always"]).default("trusted"),
});
export type RuntimePolicy = z.infer<typeof RuntimePolicy>;
export type RuntimePolicyInput = z.input<typeof RuntimePolicy>;

export interface ResolvedRuntime {
  kind: SandboxBackend;
  /** Why this sandbox was chosen, for people reading the job record. */
  reason: string;
}

const HOW_TO_OFFER: Record<SandboxBackend, string> = {
  docker: "start a Docker engine the worker can reach",
  e2b: "set E2B_API_KEY in the worker's environment",
  host: "allow host sandboxes",
};

/**
 * Chooses the sandbox for a job from what the agent asks for (its runtime wishes and whether
 * it is trusted), what a worker can offer (`capabilities`: backends whose provider is available)
 * and the worker's policy. `auto` takes the first backend in the policy's preference order
 * (strongest isolation first by default) that can honour the wishes: an `image` needs docker, a
 * `template` e2b. Throws a `no_sandbox` error that says what to change.
 */
export function resolveRuntime(
  wishes: RuntimeWishes,
  trusted: boolean,
  capabilities: ReadonlySet<SandboxBackend>,
  policy: RuntimePolicy,
): ResolvedRuntime {
  const refusal = (kind: SandboxBackend): string | undefined => {
    if (!policy.allowed.includes(kind)) return `add ${kind} to the worker's allowed sandboxes (now ${list(policy.allowed)})`;
    if (kind === "host" && policy.host === "never") return "allow host sandboxes in the worker's policy (host: trusted or always)";
    if (kind === "host" && policy.host === "trusted" && !trusted) {
      return "mark the agent `trusted: true` if it is safe to run unisolated, or set the worker's policy to host: always";
    }
    return undefined;
  };
  const usable = (kind: SandboxBackend) => refusal(kind) === undefined && capabilities.has(kind);

  if (wishes.sandbox !== "auto") {
    const kind = wishes.sandbox;
    const refused = refusal(kind);
    if (refused)
      throw noSandbox(
        `the agent asks for a ${kind} sandbox, which this worker's policy forbids for it: ${refused}, or change runtime.sandbox`,
      );
    if (!capabilities.has(kind)) {
      throw noSandbox(
        `the agent asks for a ${kind} sandbox, which this worker cannot offer now: ${HOW_TO_OFFER[kind]}, or change runtime.sandbox`,
      );
    }
    return { kind, reason: `the agent asks for ${kind}` };
  }

  const needs: SandboxBackend | undefined = wishes.image ? "docker" : wishes.template ? "e2b" : undefined;
  const order = [...policy.prefer, ...ISOLATION_ORDER.filter((k) => !policy.prefer.includes(k))];
  const candidates = needs ? [needs] : order;
  const kind = candidates.find(usable);
  if (kind) {
    if (needs) return { kind, reason: `auto: only ${kind} can provide the ${needs === "docker" ? "image" : "template"} the agent names` };
    if (kind === "host")
      return { kind, reason: "auto: host is the only sandbox this worker offers and allows for this agent (no isolation)" };
    const first = order.find(usable) === kind && order[0] === kind;
    return { kind, reason: `auto: ${kind} is ${first ? "the worker's first choice" : "the best sandbox this worker offers and allows"}` };
  }
  const offered = ISOLATION_ORDER.filter((k) => capabilities.has(k));
  const wanted = needs ? `a ${needs} sandbox (the agent names a${needs === "docker" ? "n image" : " template"})` : "a sandbox";
  const fixes = candidates.map((k) => refusal(k) ?? HOW_TO_OFFER[k]);
  throw noSandbox(`the agent needs ${wanted}; this worker offers ${list(offered)}: ${[...new Set(fixes)].join("; or ")}`);
}

const list = (kinds: readonly string[]): string => (kinds.length > 0 ? kinds.join(", ") : "none");

const noSandbox = (message: string) => new BoxcarError(ErrorCode.noSandbox, message);
