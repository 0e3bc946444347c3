/**
 * `boxcar ui`'s web server: it serves the dashboard's page (three static files) and one endpoint,
 * `POST /session`, that tells the page where NATS's WebSocket listener is and who it is. The page
 * then talks to NATS directly; nothing of Boxcar's data passes through this server.
 *
 * On a server with authentication the page needs a credential. This server holds an auth folder
 * and mints one per session request for one principal (a viewer or a submitter: never an admin,
 * whose credential would reach JetStream itself), valid for `CREDS_TTL_S` only. A browser gets a
 * session by a one-time login token, printed as a URL by `boxcar ui` and carried in the URL's
 * fragment (which a browser never sends anywhere); the exchange sets an HttpOnly, SameSite=Strict
 * cookie the page renews its credential with. Every response refuses framing, sniffing and
 * scripts from anywhere but here, and requests whose Host is not this server's own names are
 * refused (a DNS rebinding page would otherwise be same-origin with it).
 */

import { randomBytes, timingSafeEqual } from "node:crypto";
import { readFile } from "node:fs/promises";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { AuthDir } from "@boxcar/auth";
import { LOCAL_OWNER } from "@boxcar/protocol";

/** Who the page is, on a server with authentication: a user of the auth folder, and its role. */
export interface Principal {
  readonly authDir: string;
  readonly role: "viewer" | "submitter";
  readonly user: string;
}

export interface UiServerOptions {
  /** Where to listen; port 0: any free one. */
  readonly host: string;
  readonly port: number;
  /** The URL browsers reach NATS's WebSocket listener on (`ws://…` or `wss://…`). */
  readonly natsWs: string;
  readonly prefix: string;
  /** Absent: the NATS server has no authentication, and the page is its admin (`local`), as any local client is. */
  readonly principal?: Principal;
  /**
   * Other addresses this server is reached at (a published port, a proxy), beyond its listen
   * address, `localhost` and `127.0.0.1`: `host:port` for plain HTTP, or a URL such as
   * `https://dash.example` behind a TLS proxy. The first is the one the login links name.
   */
  readonly hostNames?: readonly string[];
  /** Told of each new login URL: one at start, and a fresh one each time one is used or expires. */
  readonly onLoginUrl?: (url: string) => void;
  /** How long a login link may wait to be used; default 15 minutes. */
  readonly loginLinkTtlMs?: number;
  /**
   * Where a tracing UI (Jaeger, Tempo, …) shows a trace: an http(s) URL with `{traceId}` in it,
   * which the page fills in to link a job's trace id. Absent: `$BOXCAR_TRACE_URL` (so `boxcar up`
   * takes it too), else trace ids are shown unlinked.
   */
  readonly traceUrl?: string;
}

export interface UiServer {
  /** The dashboard's address as people reach it (`http://host:port`). */
  readonly url: string;
  /**
   * The origins the NATS WebSocket listener must allow (`allowed_origins`). nats-server 2.10
   * keeps one per host name (the last listed), so two dashboards on one host need two names.
   */
  readonly origins: readonly string[];
  close(): Promise<void>;
}

/** A minted credential's lifetime; the page asks for a new one halfway through. */
export const CREDS_TTL_S = 600;
/** How long a login link may wait to be used (by default), and how long a browser session lasts. */
const TOKEN_TTL_MS = 15 * 60_000;
const SESSION_TTL_MS = 12 * 3600_000;

const WEB = fileURLToPath(new URL("./web/", import.meta.url));
const FILES: Readonly<Record<string, string>> = {
  "/": "index.html",
  "/index.html": "index.html",
  "/app.js": "app.js",
  "/app.css": "app.css",
};
const TYPES: Readonly<Record<string, string>> = {
  html: "text/html; charset=utf-8",
  js: "text/javascript; charset=utf-8",
  css: "text/css; charset=utf-8",
};

export async function startUiServer(opts: UiServerOptions): Promise<UiServer> {
  const ws = new URL(opts.natsWs);
  if (ws.protocol !== "ws:" && ws.protocol !== "wss:")
    throw new RangeError(`the NATS WebSocket URL must be ws:// or wss://, got ${opts.natsWs}`);
  const files = new Map<string, Buffer>();
  for (const name of new Set(Object.values(FILES))) {
    files.set(name, await readFile(`${WEB}${name}`).catch(() => Buffer.from("")));
  }
  if ((files.get("app.js")?.length ?? 0) === 0) {
    throw new Error(`the dashboard's page is not built (${WEB}app.js): run \`pnpm run build\``);
  }
  if (opts.principal) await checkPrincipal(opts.principal);
  const traceUrl = checkTraceUrl(opts.traceUrl ?? (process.env.BOXCAR_TRACE_URL || undefined));

  const tokens = new Map<string, number>(); // login token -> expires at
  const sessions = new Map<string, number>(); // session id -> expires at
  const security = {
    "content-security-policy": [
      "default-src 'none'",
      "script-src 'self'",
      "style-src 'self'",
      "img-src 'self' data:",
      `connect-src 'self' ${ws.origin}`,
      "base-uri 'none'",
      "form-action 'none'",
      "frame-ancestors 'none'",
    ].join("; "),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((err: Error) => reply(res, 500, { error: err.message }));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const hostPart = opts.host.includes(":") ? `[${opts.host}]` : opts.host;
  const listening = `http://${hostPart}:${port}`;
  // Where people reach it: a name given, else this machine's loopback for an any-address listener.
  const named = (opts.hostNames ?? []).map(publicAddress);
  const url = named[0]?.origin ?? (opts.host === "0.0.0.0" || opts.host === "::" ? `http://127.0.0.1:${port}` : listening);
  const hosts = new Set([`${hostPart}:${port}`, `localhost:${port}`, `127.0.0.1:${port}`, ...named.map((a) => a.host)]);
  const origins = [...new Set([...named.map((a) => a.origin), listening, `http://localhost:${port}`, `http://127.0.0.1:${port}`])];
  // Browsers keep cookies per host, not per port: each dashboard has a cookie of its own.
  const cookieName = `boxcar_ui_${port}`;

  // One link is open at a time: a new one follows each use, and each expiry (so one is always there to use).
  let expiry: ReturnType<typeof setTimeout> | undefined;
  const newLoginUrl = () => {
    if (!opts.principal) return;
    if (expiry !== undefined) clearTimeout(expiry);
    const token = randomBytes(24).toString("base64url");
    const ttl = opts.loginLinkTtlMs ?? TOKEN_TTL_MS;
    tokens.set(token, Date.now() + ttl);
    expiry = setTimeout(newLoginUrl, ttl);
    expiry.unref();
    opts.onLoginUrl?.(`${url}/#t=${token}`);
  };
  newLoginUrl();

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (!hosts.has(req.headers.host ?? "")) return reply(res, 421, { error: `this dashboard answers to ${[...hosts].join(", ")} only` });
    const path = (req.url ?? "/").split("?")[0] as string;
    if (path === "/session") {
      if (req.method !== "POST") return reply(res, 405, { error: "POST /session" }, { allow: "POST" });
      const origin = req.headers.origin;
      if (origin !== undefined && !origins.includes(origin))
        return reply(res, 403, { error: `a page from ${origin} may not open a session` });
      return await session(req, res);
    }
    const file = FILES[path];
    if (file === undefined) return reply(res, 404, { error: `no ${path} here` });
    if (req.method !== "GET" && req.method !== "HEAD") return reply(res, 405, { error: `${req.method} ${path}` }, { allow: "GET, HEAD" });
    const body = files.get(file) as Buffer;
    res.writeHead(200, {
      ...security,
      "content-type": TYPES[file.split(".").pop() ?? ""] ?? "application/octet-stream",
      "content-length": body.length,
    });
    res.end(req.method === "HEAD" ? undefined : body);
  }

  async function session(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const base = { ws: opts.natsWs, prefix: opts.prefix, ...(traceUrl ? { traceUrl } : {}) };
    const principal = opts.principal;
    if (!principal) return reply(res, 200, { ...base, role: "admin", user: LOCAL_OWNER });
    const now = Date.now();
    for (const [k, until] of tokens) if (until < now) tokens.delete(k);
    for (const [k, until] of sessions) if (until < now) sessions.delete(k);
    const headers: Record<string, string> = {};
    const token = /^Bearer ([A-Za-z0-9_-]{1,64})$/.exec(req.headers.authorization ?? "")?.[1];
    const cookie = cookieOf(req, cookieName);
    if (token !== undefined) {
      if (!takeOnce(tokens, token)) {
        return reply(res, 401, { error: "this login link was used or has expired: use the newest one boxcar ui (or boxcar up) printed" });
      }
      const id = randomBytes(24).toString("base64url");
      sessions.set(id, now + SESSION_TTL_MS);
      const secure = url.startsWith("https:") ? "; Secure" : "";
      headers["set-cookie"] = `${cookieName}=${id}; HttpOnly; SameSite=Strict; Path=/session; Max-Age=${SESSION_TTL_MS / 1000}${secure}`;
      newLoginUrl();
    } else if (cookie === undefined || !sessions.has(cookie)) {
      return reply(res, 401, { error: "not logged in: open the login link boxcar ui printed" });
    }
    let creds: string;
    try {
      const auth = await AuthDir.open(principal.authDir); // read again: a revoked user gets no more
      creds = await auth.mintShortLived(principal.user, principal.role, CREDS_TTL_S);
    } catch (err) {
      return reply(res, 403, { error: `no credential for ${principal.role} ${principal.user}: ${(err as Error).message}` });
    }
    return reply(res, 200, { ...base, role: principal.role, user: principal.user, creds, expiresAt: now + CREDS_TTL_S * 1000 }, headers);
  }

  function reply(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    const text = JSON.stringify(body);
    res.writeHead(status, { ...security, ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(text) });
    res.end(text);
  }

  return {
    url,
    origins,
    close: () =>
      new Promise<void>((resolve) => {
        if (expiry !== undefined) clearTimeout(expiry);
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** `host:port` (plain HTTP) or a URL, as the Host header and the origin a browser sends. */
function publicAddress(address: string): { host: string; origin: string } {
  const url = new URL(/^[a-z]+:\/\//.test(address) ? address : `http://${address}`);
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new RangeError(`a dashboard address is host:port or an http(s) URL, got ${address}`);
  return { host: url.host, origin: url.origin };
}

/** A tracing UI's address template: an http(s) URL with `{traceId}` in it (refused otherwise, at start). */
function checkTraceUrl(template: string | undefined): string | undefined {
  if (template === undefined) return undefined;
  let url: URL | undefined;
  try {
    url = new URL(template.replaceAll("{traceId}", "0".repeat(32)));
  } catch {
    url = undefined;
  }
  if (!template.includes("{traceId}") || (url?.protocol !== "http:" && url?.protocol !== "https:")) {
    throw new RangeError(
      `a trace URL is an http(s) address with {traceId} in it, such as http://127.0.0.1:16686/trace/{traceId}; got ${template}`,
    );
  }
  return template;
}

/** Refuses at start a principal the auth folder cannot mint for. */
async function checkPrincipal(p: Principal): Promise<void> {
  const auth = await AuthDir.open(p.authDir);
  await auth.mintShortLived(p.user, p.role, 60);
}

/** Removes `token` from `tokens` and says whether it was there (compared in constant time). */
function takeOnce(tokens: Map<string, number>, token: string): boolean {
  const given = Buffer.from(token);
  for (const known of tokens.keys()) {
    const k = Buffer.from(known);
    if (k.length === given.length && timingSafeEqual(k, given)) {
      tokens.delete(known);
      return true;
    }
  }
  return false;
}

function cookieOf(req: IncomingMessage, name: string): string | undefined {
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const [k, v] = part.trim().split("=", 2);
    if (k === name && v) return v;
  }
  return undefined;
}
