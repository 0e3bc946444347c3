import { BoxcarError, ErrorCode, type RuntimeWishes } from "@boxcar/protocol";
import type { SandboxBackend } from "./sandbox.js";

/** Which sandboxes a worker may use, whatever it can offer. */
export interface RuntimePolicy {
  allowed: readonly SandboxBackend[];
  /** Host sandboxes isolate nothing: they must be allowed here as well as in `allowed`. */
  allowHost: boolean;
}

export interface ResolvedRuntime {
  kind: SandboxBackend;
  /** Why this sandbox was chosen, for people reading the job record. */
  reason: string;
}

/** Strongest isolation first. */
const AUTO_ORDER: readonly SandboxBackend[] = ["docker", "e2b", "host"];

const HOW_TO_OFFER: Record<SandboxBackend, string> = {
  docker: "start a Docker engine the worker can reach",
  e2b: "set E2B_API_KEY in the worker's environment",
  host: "run the worker with host sandboxes allowed",
};

/**
 * Chooses the sandbox for a job from what the agent asks for, what this worker can offer
 * (`capabilities`: backends whose provider is available) and the worker's policy. `auto` takes
 * the strongest isolation that can honour the wishes: an `image` needs docker, a `template` e2b.
 * Throws a `no_sandbox` error that says what to change.
 */
export function resolveRuntime(wishes: RuntimeWishes, capabilities: ReadonlySet<SandboxBackend>, policy: RuntimePolicy): ResolvedRuntime {
  const permitted = (kind: SandboxBackend) => policy.allowed.includes(kind) && (kind !== "host" || policy.allowHost);
  if (wishes.sandbox !== "auto") {
    const kind = wishes.sandbox;
    if (!permitted(kind)) {
      throw noSandbox(
        `the agent asks for a ${kind} sandbox, which this worker's policy forbids: change runtime.sandbox, or ${permit(kind, policy)}`,
      );
    }
    if (!capabilities.has(kind)) {
      throw noSandbox(
        `the agent asks for a ${kind} sandbox, which this worker cannot offer now: ${HOW_TO_OFFER[kind]}, or change runtime.sandbox`,
      );
    }
    return { kind, reason: `the agent asks for ${kind}` };
  }

  const needs: SandboxBackend | undefined = wishes.image ? "docker" : wishes.template ? "e2b" : undefined;
  const candidates = needs ? [needs] : AUTO_ORDER;
  const kind = candidates.find((k) => permitted(k) && capabilities.has(k));
  if (kind) {
    if (needs) return { kind, reason: `auto: only ${kind} can provide the ${needs === "docker" ? "image" : "template"} the agent names` };
    if (kind === "host") return { kind, reason: "auto: host is the only sandbox this worker offers and allows (no isolation)" };
    return { kind, reason: `auto: ${kind} is the strongest isolation this worker offers and allows` };
  }
  const offered = AUTO_ORDER.filter((k) => capabilities.has(k));
  const allowed = AUTO_ORDER.filter(permitted);
  const wanted = needs ? `a ${needs} sandbox (the agent names a${needs === "docker" ? "n image" : " template"})` : "any sandbox";
  const fixes = candidates.map((k) => (permitted(k) ? HOW_TO_OFFER[k] : permit(k, policy)));
  throw noSandbox(`the agent needs ${wanted}; this worker offers ${list(offered)} and allows ${list(allowed)}: ${fixes.join(", or ")}`);
}

/** What to change in the policy so it permits `kind`. */
function permit(kind: SandboxBackend, policy: RuntimePolicy): string {
  if (kind === "host" && policy.allowed.includes("host")) return "set allowHost in the worker's policy";
  return `add ${kind} to the worker's allowed sandboxes (now ${list(policy.allowed)})`;
}

const list = (kinds: readonly string[]): string => (kinds.length > 0 ? kinds.join(", ") : "none");

const noSandbox = (message: string) => new BoxcarError(ErrorCode.noSandbox, message);
