import { type AgentModels, BoxcarError, ErrorCode, type ModelProvider, type SandboxBackend } from "@boxcar/protocol";

/**
 * Whether an agent that lists `models` can run here, before anything starts: the worker must
 * hold a key for each of its providers, and its sandbox must reach the gateway (a prompt agent's
 * calls are the worker's own: `sandbox` is then undefined). Throws the reason.
 */
export function checkModels(
  models: AgentModels | undefined,
  sandbox: SandboxBackend | undefined,
  gateway: { providers: readonly ModelProvider[]; publicUrl?: string | undefined } | undefined,
): void {
  if (!models) return;
  const held = gateway?.providers ?? [];
  const missing = models.providers.filter((p) => !held.includes(p));
  if (missing.length > 0) {
    throw new BoxcarError(
      ErrorCode.missingSecret,
      `this worker holds no key for ${missing.join(", ")} (models.providers): start it with ${missing.map((p) => `--model-key ${p}=VARIABLE`).join(" ")}`,
    );
  }
  if (sandbox === "e2b" && !gateway?.publicUrl) {
    throw new BoxcarError(
      ErrorCode.noSandbox,
      "an E2B sandbox reaches the model gateway only at an address E2B's cloud can reach: expose this worker's gateway and give it as --model-gateway-url URL (models.publicUrl) (docs/models.md#e2b-agents)",
    );
  }
}
