import type { IncomingMessage, ServerResponse } from "node:http";
import { readBody } from "./connect.js";
import { StandInSandbox, type StandInTemplate } from "./sandbox.js";

export interface ControlPlane {
  apiKey: string;
  envdVersion: string;
  templates: ReadonlyMap<string, StandInTemplate>;
  /** Running sandboxes the team may have at once; more get 429, as on E2B. */
  maxRunning: number;
  /** Every sandbox ever created, killed ones included (the API shows only running ones). */
  sandboxes: Map<string, StandInSandbox>;
  /** Where sandbox folders are created. */
  root: string;
}

/** Fields of `POST /v2/sandboxes` the stand-in honours; any other field is refused. */
const CREATE_FIELDS = new Set(["templateID", "metadata", "envVars", "timeout", "allow_internet_access", "network"]);

/**
 * The control-plane API calls Boxcar's E2B backend makes: create (`POST /v2/sandboxes`), list
 * (`GET /v2/sandboxes`), info (`GET /sandboxes/{id}`), kill (`DELETE /sandboxes/{id}`) and set
 * timeout (`POST /sandboxes/{id}/timeout`), each checking `X-API-KEY`.
 */
export function createApiHandler(plane: ControlPlane) {
  return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const url = new URL(req.url ?? "/", "http://api");
    if (req.headers["x-api-key"] !== plane.apiKey) return apiError(res, 401, "Invalid API key");
    try {
      const one = /^\/sandboxes\/([^/]+)(\/timeout)?$/.exec(url.pathname);
      if (url.pathname === "/v2/sandboxes" && req.method === "POST") return await create(plane, await readJson(req), res);
      if (url.pathname === "/v2/sandboxes" && req.method === "GET") return list(plane, url, res);
      if (one) {
        const sandbox = plane.sandboxes.get(decodeURIComponent(one[1] ?? ""));
        if (sandbox?.state !== "running") return apiError(res, 404, `sandbox "${one[1]}" doesn't exist or you don't have access to it`);
        if (!one[2] && req.method === "GET") return sendJson(res, 200, detail(plane, sandbox));
        if (!one[2] && req.method === "DELETE") {
          await sandbox.kill("request");
          res.writeHead(204).end();
          return;
        }
        if (one[2] && req.method === "POST") {
          const { timeout } = await readJson(req);
          if (!Number.isInteger(timeout) || (timeout as number) < 0) return apiError(res, 400, "timeout must be a whole number of seconds");
          sandbox.setTimeout(timeout as number);
          res.writeHead(204).end();
          return;
        }
      }
      return apiError(res, 404, `the stand-in does not implement ${req.method} ${url.pathname}`);
    } catch (err) {
      if (!res.headersSent) apiError(res, 500, (err as Error).message);
    }
  };
}

async function create(plane: ControlPlane, body: Record<string, unknown>, res: ServerResponse): Promise<void> {
  const unknown = Object.keys(body).filter((k) => !CREATE_FIELDS.has(k));
  if (unknown.length > 0) return apiError(res, 400, `the stand-in does not implement ${unknown.join(", ")}`);
  const { templateID, metadata = {}, envVars = {}, timeout = 300, allow_internet_access, network } = body;
  if (typeof templateID !== "string") return apiError(res, 400, "templateID is required");
  if (!Number.isInteger(timeout) || (timeout as number) < 0) return apiError(res, 400, "timeout must be a whole number of seconds");
  if (!isStringRecord(metadata) || !isStringRecord(envVars)) return apiError(res, 400, "metadata and envVars map strings to strings");
  if (allow_internet_access !== undefined && typeof allow_internet_access !== "boolean") {
    return apiError(res, 400, "allow_internet_access must be a boolean");
  }
  if (network !== undefined && !isNetworkConfig(network))
    return apiError(res, 400, "network.allowOut and network.denyOut are lists of strings");
  const template = plane.templates.get(templateID);
  if (!template) return apiError(res, 404, `template '${templateID}' not found`);
  const running = [...plane.sandboxes.values()].filter((s) => s.state === "running").length;
  if (running >= plane.maxRunning) {
    return apiError(res, 429, `You have reached the maximum number of concurrent E2B sandboxes (${plane.maxRunning})`);
  }
  const sandbox = await StandInSandbox.create(plane.root, {
    templateId: templateID,
    template,
    metadata,
    envVars,
    timeoutSeconds: timeout as number,
    allowInternetAccess: allow_internet_access,
    ...(network !== undefined ? { network } : {}),
  });
  plane.sandboxes.set(sandbox.id, sandbox);
  sendJson(res, 201, {
    sandboxID: sandbox.id,
    templateID,
    alias: templateID,
    clientID: "stand-in",
    envdVersion: plane.envdVersion,
    envdAccessToken: sandbox.envdAccessToken,
  });
}

/** `GET /v2/sandboxes?metadata=&state=&limit=&nextToken=`: running sandboxes, filtered and paged. */
function list(plane: ControlPlane, url: URL, res: ServerResponse): void {
  // `metadata` is a query string of its own whose keys and values are URI-encoded once more.
  const wanted = [...new URLSearchParams(url.searchParams.get("metadata") ?? "")].map(([k, v]) => [
    decodeURIComponent(k),
    decodeURIComponent(v),
  ]);
  const states = (url.searchParams.get("state") ?? "running,paused").split(",");
  const matching = [...plane.sandboxes.values()].filter(
    (s) => s.state === "running" && states.includes("running") && wanted.every(([k, v]) => s.metadata[k ?? ""] === v),
  );
  const limit = Number(url.searchParams.get("limit") ?? 100);
  const offset = Number(url.searchParams.get("nextToken") ?? 0);
  const page = matching.slice(offset, offset + limit);
  if (offset + limit < matching.length) res.setHeader("x-next-token", String(offset + limit));
  sendJson(
    res,
    200,
    page.map((s) => listed(plane, s)),
  );
}

function listed(plane: ControlPlane, s: StandInSandbox): object {
  return {
    sandboxID: s.id,
    templateID: s.templateId,
    alias: s.templateId,
    clientID: "stand-in",
    startedAt: s.startedAt.toISOString(),
    endAt: s.endAt.toISOString(),
    cpuCount: s.template.cpuCount,
    memoryMB: s.template.memoryMB,
    diskSizeMB: 0,
    envdVersion: plane.envdVersion,
    state: "running",
    metadata: s.metadata,
  };
}

function detail(plane: ControlPlane, s: StandInSandbox): object {
  return {
    ...listed(plane, s),
    envdAccessToken: s.envdAccessToken,
    ...(s.allowInternetAccess !== undefined ? { allowInternetAccess: s.allowInternetAccess } : {}),
  };
}

async function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  const body = await readBody(req);
  const parsed: unknown = body.length === 0 ? {} : JSON.parse(body.toString("utf8"));
  return parsed !== null && typeof parsed === "object" ? (parsed as Record<string, unknown>) : {};
}

function isStringRecord(value: unknown): value is Record<string, string> {
  return value !== null && typeof value === "object" && Object.values(value).every((v) => typeof v === "string");
}

function isNetworkConfig(value: unknown): value is { allowOut?: string[]; denyOut?: string[] } {
  const list = (v: unknown) => v === undefined || (Array.isArray(v) && v.every((x) => typeof x === "string"));
  return (
    value !== null &&
    typeof value === "object" &&
    list((value as { allowOut?: unknown }).allowOut) &&
    list((value as { denyOut?: unknown }).denyOut)
  );
}

function sendJson(res: ServerResponse, status: number, value: unknown): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

/** E2B's API error body: `{ code, message }`. */
function apiError(res: ServerResponse, status: number, message: string): void {
  sendJson(res, status, { code: status, message });
}
