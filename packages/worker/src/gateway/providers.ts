import type { IncomingHttpHeaders } from "node:http";
import type { ModelProvider } from "@boxcar/protocol";

/**
 * Each provider's wire format as far as the gateway needs it: where its agents' base URL points,
 * where its API is, how a caller's credential travels (which the gateway swaps for the real
 * key), the variables its official SDK reads, and the shape of its errors (so an SDK that gets
 * one of the gateway's own reads it as it would the provider's).
 */
export interface ProviderWire {
  readonly name: ModelProvider;
  /** The path the agent's base URL ends with, on the gateway: requests below it go to the provider. */
  readonly basePath: string;
  /** The provider's own base URL, which the path below `basePath` is appended to. */
  readonly defaultUpstream: string;
  /** The credential the caller sent: the attempt's token. */
  tokenOf(headers: IncomingHttpHeaders): string | undefined;
  /** The headers that carry the real key upstream. */
  authHeaders(key: string): Record<string, string>;
  /** An error in the provider's own shape (`code`: OpenAI's error code, where it has one for the case). */
  errorBody(status: number, message: string, code?: string): string;
  /** The variables its official SDK (and CLIs built on it) read: base URL and key. */
  env(baseUrl: string, token: string): Record<string, string>;
}

const bearer = (headers: IncomingHttpHeaders): string | undefined => {
  const value = headers.authorization;
  return typeof value === "string" && value.toLowerCase().startsWith("bearer ") ? value.slice(7).trim() : undefined;
};

/** Anthropic's Messages API: `x-api-key` (or a bearer token, as Claude Code may send), errors `{type: "error", error: {type, message}}`. */
const anthropic: ProviderWire = {
  name: "anthropic",
  basePath: "/anthropic",
  defaultUpstream: "https://api.anthropic.com",
  tokenOf: (headers) => (typeof headers["x-api-key"] === "string" ? headers["x-api-key"] : bearer(headers)),
  authHeaders: (key) => ({ "x-api-key": key }),
  errorBody: (status, message) =>
    JSON.stringify({
      type: "error",
      error: {
        type:
          status === 401
            ? "authentication_error"
            : status === 403
              ? "permission_error"
              : status === 404
                ? "not_found_error"
                : status === 413
                  ? "request_too_large"
                  : status === 429
                    ? "rate_limit_error"
                    : status >= 500
                      ? "api_error"
                      : "invalid_request_error",
        message,
      },
    }),
  env: (baseUrl, token) => ({ ANTHROPIC_BASE_URL: baseUrl, ANTHROPIC_API_KEY: token }),
};

/** OpenAI's API (Chat Completions, Responses): a bearer token, errors `{error: {message, type, code}}`. */
const openai: ProviderWire = {
  name: "openai",
  basePath: "/openai/v1",
  defaultUpstream: "https://api.openai.com/v1",
  tokenOf: bearer,
  authHeaders: (key) => ({ authorization: `Bearer ${key}` }),
  errorBody: (status, message, code) =>
    JSON.stringify({
      error: {
        message,
        type: code ?? (status === 429 ? "rate_limit_exceeded" : status >= 500 ? "server_error" : "invalid_request_error"),
        code: code ?? (status === 401 ? "invalid_api_key" : null),
        param: null,
      },
    }),
  env: (baseUrl, token) => ({ OPENAI_BASE_URL: baseUrl, OPENAI_API_KEY: token }),
};

export const PROVIDER_WIRES: Readonly<Record<ModelProvider, ProviderWire>> = { anthropic, openai };

/** The provider a request's path is for, and the path below its base; undefined for any other path. */
export function routeOf(path: string): { wire: ProviderWire; rest: string } | undefined {
  for (const wire of Object.values(PROVIDER_WIRES)) {
    if (path === wire.basePath || path.startsWith(`${wire.basePath}/`)) return { wire, rest: path.slice(wire.basePath.length) };
  }
  return undefined;
}
