import { type AgentModels, BoxcarError, ErrorCode, type ModelProvider, type SandboxBackend } from "@boxcar/protocol";

/**
 * Whether an agent that lists `models` can run here, before anything starts: the worker must
 * hold a key for each of its providers, and its sandbox must reach the gateway. Throws the reason.
 */
export function checkModels(models: AgentModels | undefined, sandbox: SandboxBackend, held: readonly ModelProvider[]): void {
  if (!models) return;
  const missing = models.providers.filter((p) => !held.includes(p));
  if (missing.length > 0) {
    throw new BoxcarError(
      ErrorCode.missingSecret,
      `this worker holds no key for ${missing.join(", ")} (models.providers): start it with ${missing.map((p) => `--model-key ${p}=VARIABLE`).join(" ")}`,
    );
  }
  if (sandbox === "e2b") {
    throw new BoxcarError(
      ErrorCode.noSandbox,
      "the model gateway reaches host and Docker agents in this release; an E2B agent cannot call it yet (docs/models.md)",
    );
  }
}
