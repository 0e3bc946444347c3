import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import { AuthenticationError, RateLimitError, SandboxError, SandboxNotFoundError, ServiceBusyError, TimeoutError } from "e2b";

/**
 * What the SDK threw, as a BoxcarError that says what failed and why, with the SDK's error as
 * its cause: 401 and 429 are `sandbox_failed`, a missing template (404 on create) is
 * `image_unavailable`, a refused request (400) is `invalid`, an unreachable or busy E2B is
 * `unavailable`, and a sandbox that is gone (killed, or its timeout passed) is `sandbox_failed`.
 */
export function e2bError(err: unknown, doing: string, context: { template?: string } = {}): BoxcarError {
  if (err instanceof BoxcarError) return err;
  const reason = firstLine(err);
  const make = (code: ErrorCode, message: string) => new BoxcarError(code, message, { cause: err });
  if (err instanceof AuthenticationError) {
    return make(ErrorCode.sandboxFailed, `${doing}: E2B refused the worker's API key (401): check E2B_API_KEY in the worker's environment`);
  }
  if (err instanceof RateLimitError) {
    return make(ErrorCode.sandboxFailed, `${doing}: E2B's rate limit or sandbox quota is reached (429): ${reason}`);
  }
  if (err instanceof ServiceBusyError) return make(ErrorCode.unavailable, `${doing}: E2B is busy (503), try again later: ${reason}`);
  if (err instanceof TimeoutError || err instanceof SandboxNotFoundError) {
    return make(ErrorCode.sandboxFailed, `${doing}: the sandbox is gone or did not answer (killed, or its E2B timeout passed): ${reason}`);
  }
  if (err instanceof SandboxError && err.statusCode === 404 && context.template !== undefined) {
    return make(ErrorCode.imageUnavailable, `${doing}: E2B has no template ${context.template} (404): ${reason}`);
  }
  if (err instanceof SandboxError && err.statusCode === 400)
    return make(ErrorCode.invalid, `${doing}: E2B refused the request (400): ${reason}`);
  if (err instanceof TypeError && err.cause !== undefined) {
    return make(ErrorCode.unavailable, `${doing}: cannot reach E2B: ${firstLine(err.cause)}`);
  }
  if (err instanceof DOMException && err.name === "TimeoutError")
    return make(ErrorCode.unavailable, `${doing}: E2B did not answer in time`);
  return make(ErrorCode.sandboxFailed, `${doing}: ${reason}`);
}

export function firstLine(err: unknown): string {
  const message = err instanceof Error ? err.message || err.name : String(err);
  const code = (err as { code?: unknown }).code;
  const text = typeof code === "string" && !message.includes(code) ? `${message} (${code})` : message;
  return text.split("\n")[0] ?? text;
}
