import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import {
  BoxcarError,
  ErrorCode,
  type Identity,
  maskUrl,
  NATS_CONNECTION_ENV,
  NatsConnectionSettings,
  OPEN_IDENTITY,
  parseIdentity,
  ROLE_TAG,
  Role,
  UserName,
  zodIssues,
} from "@boxcar/protocol";
import { connect, credsAuthenticator, type NatsConnection, nkeyAuthenticator } from "@nats-io/transport-node";

export const DEFAULT_NATS_URL = "nats://127.0.0.1:4222";
/** How long the first connection may take (nats.js waits 20 s by default). */
const CONNECT_TIMEOUT_MS = 10_000;

/** Settings resolved from flags, the environment, a `nats` context and a config file, in that order. */
export interface ResolvedConnection {
  readonly servers: readonly string[];
  readonly settings: NatsConnectionSettings;
  /** Who this connection asks as (see `identityOf`). */
  readonly identity: Identity;
  /** The user's nkey seed (from `creds` or `nkey`), which a dispatcher signs work items with. */
  readonly seed?: Uint8Array;
  /** The credentials file's text, when there is one. */
  readonly creds?: string;
}

export interface ResolveConnectionOptions {
  /** Given on the command line; wins over everything. */
  flags?: NatsConnectionSettings;
  env?: NodeJS.ProcessEnv;
  /** From a config file (the worker's); loses to the rest. */
  file?: NatsConnectionSettings;
}

/**
 * Resolves how to connect: each setting from the flag, else its environment variable, else the
 * `nats` context (`--context` / `NATS_CONTEXT`, read from `$XDG_CONFIG_HOME/nats/context/NAME.json`),
 * else the config file; the URL defaults to `nats://127.0.0.1:4222`. Reads the credential files
 * named, so a missing or unreadable one is an error here, naming the file and where it was set.
 */
export function resolveConnection(opts: ResolveConnectionOptions = {}): ResolvedConnection {
  const env = opts.env ?? process.env;
  const fromEnv = settingsFromEnv(env);
  const contextName = opts.flags?.context ?? fromEnv.context ?? opts.file?.context;
  const fromContext = contextName ? readNatsContext(contextName, env) : {};
  const settings: NatsConnectionSettings = { ...opts.file, ...fromContext, ...fromEnv, ...definedOnly(opts.flags ?? {}) };
  const servers: string[] = [];
  for (const url of (settings.nats ?? DEFAULT_NATS_URL).split(",").map((s) => s.trim())) {
    if (url === "") continue;
    // `nats://user:password@host` or `nats://token@host`, as the nats CLI takes them: nats.js
    // does not read them from the URL, so they become settings (flags still win).
    const at = /^([a-z]+:\/\/)([^@/]*)@(.*)$/i.exec(url);
    if (at) {
      const [user, ...pass] = decodeURIComponent(at[2] ?? "").split(":");
      if (pass.length > 0) {
        settings.user ??= user;
        settings.password ??= pass.join(":");
      } else settings.token ??= user;
    }
    servers.push(at ? `${at[1]}${at[3]}` : url);
  }
  if (servers.length === 0) throw invalid(`--nats / BOXCAR_NATS_URL names no server`);
  if ((settings.tlsCert === undefined) !== (settings.tlsKey === undefined)) {
    throw invalid("--tls-cert and --tls-key go together: give both or neither");
  }
  const creds = settings.creds !== undefined ? readCredential(settings.creds, "--creds / NATS_CREDS") : undefined;
  if (creds !== undefined && !JWT_BLOCK.test(creds)) {
    throw invalid(
      `--creds / NATS_CREDS: ${settings.creds} holds no user JWT (a credentials file, as \`boxcar auth\` writes; for a bare nkey seed use --nkey)`,
    );
  }
  const nkey = settings.nkey !== undefined ? readCredential(settings.nkey, "--nkey / NATS_NKEY") : undefined;
  const seed = creds ? seedOfCreds(creds) : nkey ? new TextEncoder().encode(nkey.trim()) : undefined;
  return {
    servers,
    settings,
    identity: identityOf(creds, env),
    ...(seed ? { seed } : {}),
    ...(creds ? { creds } : {}),
  };
}

/**
 * Who a connection asks as: `BOXCAR_IDENTITY` (`role:user`) when set; else the name and
 * `boxcar-role` tag of the user JWT in its credentials file (as `boxcar auth` writes them); else
 * an admin named `local`, what every caller of a server without authentication is. NATS
 * permissions decide what the credential may really do; the identity only picks the subjects.
 */
export function identityOf(creds: string | undefined, env: NodeJS.ProcessEnv = process.env): Identity {
  if (env.BOXCAR_IDENTITY) {
    try {
      return parseIdentity(env.BOXCAR_IDENTITY);
    } catch (err) {
      throw invalid(`BOXCAR_IDENTITY: ${(err as Error).message}`);
    }
  }
  if (creds === undefined) return OPEN_IDENTITY;
  const claims = userClaims(creds);
  const tag = claims.tags.find((t) => t.startsWith(`${ROLE_TAG}:`));
  const role = Role.safeParse(tag?.slice(ROLE_TAG.length + 1));
  if (!role.success || !UserName.safeParse(claims.name).success) {
    throw invalid(
      `the credentials file's user ${JSON.stringify(claims.name)} has no ${ROLE_TAG} tag or no usable name: mint it with \`boxcar auth add\`, or set BOXCAR_IDENTITY=ROLE:USER`,
    );
  }
  return { role: role.data, user: claims.name };
}

/** Connects with the resolved settings. A failure names the servers with any password masked. */
export async function connectNats(resolved: ResolvedConnection, name: string): Promise<NatsConnection> {
  const s = resolved.settings;
  const tls =
    s.tlsCert || s.tlsCa || s.tlsFirst
      ? {
          ...(s.tlsCert ? { certFile: s.tlsCert } : {}),
          ...(s.tlsKey ? { keyFile: s.tlsKey } : {}),
          ...(s.tlsCa ? { caFile: s.tlsCa } : {}),
          ...(s.tlsFirst ? { handshakeFirst: true } : {}),
        }
      : undefined;
  const authenticator = resolved.creds
    ? credsAuthenticator(new TextEncoder().encode(resolved.creds))
    : resolved.seed
      ? nkeyAuthenticator(resolved.seed)
      : undefined;
  try {
    return await connect({
      servers: [...resolved.servers],
      name,
      maxReconnectAttempts: -1,
      // No async stack traces: nats.js builds one per request, a large share of a busy worker's CPU.
      noAsyncTraces: true,
      timeout: CONNECT_TIMEOUT_MS,
      inboxPrefix: `_INBOX.${resolved.identity.user}`,
      ...(s.user !== undefined ? { user: s.user } : {}),
      ...(s.password !== undefined ? { pass: s.password } : {}),
      ...(s.token !== undefined ? { token: s.token } : {}),
      ...(authenticator ? { authenticator } : {}),
      ...(tls ? { tls } : {}),
    });
  } catch (cause) {
    const reason = redact((cause as Error).message, s);
    // A server that wants a client certificate drops the handshake; nats.js only sees a timeout.
    const hint =
      tls && !s.tlsCert && /timeout/i.test(reason)
        ? "if the server wants a client certificate, give --tls-cert and --tls-key"
        : /certificate|self.signed/i.test(reason)
          ? "the server's certificate is not signed by a CA this process trusts: give --tls-ca FILE or NATS_CA (for a system `boxcar auth init` set up, its tls/ca.pem)"
          : "set --nats or BOXCAR_NATS_URL, and --creds or another credential if the server wants one; `boxcar up` starts a local server";
    throw new BoxcarError(
      ErrorCode.unavailable,
      `cannot connect to NATS at ${resolved.servers.map(maskUrl).join(", ")}: ${reason} (${hint})`,
      { cause },
    );
  }
}

function settingsFromEnv(env: NodeJS.ProcessEnv): NatsConnectionSettings {
  const out: Record<string, string | boolean> = {};
  for (const [key, names] of Object.entries(NATS_CONNECTION_ENV)) {
    const value = names.map((n) => env[n]).find((v) => v !== undefined && v !== "");
    if (value === undefined) continue;
    out[key] = key === "tlsFirst" ? value === "1" || value.toLowerCase() === "true" : value;
  }
  return out as NatsConnectionSettings;
}

/** The `nats` CLI's context file format (the fields Boxcar uses). */
interface NatsContextFile {
  url?: string;
  token?: string;
  user?: string;
  password?: string;
  creds?: string;
  nkey?: string;
  cert?: string;
  key?: string;
  ca?: string;
  tls_first?: boolean;
}

/** Reads `$XDG_CONFIG_HOME/nats/context/NAME.json` (default `~/.config`), as the `nats` CLI writes it. */
export function readNatsContext(name: string, env: NodeJS.ProcessEnv = process.env): NatsConnectionSettings {
  const parsedName = NatsConnectionSettings.shape.context.safeParse(name);
  if (!parsedName.success) throw invalid(`--context / NATS_CONTEXT: ${JSON.stringify(name)} is not a context name`);
  const file = join(env.XDG_CONFIG_HOME || join(env.HOME || homedir(), ".config"), "nats", "context", `${name}.json`);
  let ctx: NatsContextFile;
  try {
    ctx = JSON.parse(readFileSync(file, "utf8")) as NatsContextFile;
  } catch (err) {
    throw invalid(`nats context ${name}: cannot read ${file}: ${(err as Error).message}`);
  }
  const home = (p: string | undefined) => (p ? p.replace(/^~(?=\/|$)/, env.HOME || homedir()) : undefined);
  const raw = {
    nats: ctx.url || undefined,
    token: ctx.token || undefined,
    user: ctx.user || undefined,
    password: ctx.password || undefined,
    creds: home(ctx.creds),
    nkey: home(ctx.nkey),
    tlsCert: home(ctx.cert),
    tlsKey: home(ctx.key),
    tlsCa: home(ctx.ca),
    tlsFirst: ctx.tls_first || undefined,
  };
  const parsed = NatsConnectionSettings.safeParse(definedOnly(raw));
  if (!parsed.success)
    throw invalid(
      `nats context ${name} (${file}): ${zodIssues(parsed.error)
        .map((i) => `${i.path}: ${i.message}`)
        .join("; ")}`,
    );
  return parsed.data;
}

function definedOnly<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

function readCredential(file: string, what: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (err) {
    throw invalid(`${what}: cannot read ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
}

const JWT_BLOCK = /-----BEGIN NATS USER JWT-----\s*([^\s-][^\s]*)\s*------END NATS USER JWT------/;
const SEED_BLOCK = /-----BEGIN USER NKEY SEED-----\s*(S[A-Z0-9]+)\s*------END USER NKEY SEED------/;

function userClaims(creds: string): { name: string; tags: string[] } {
  const jwt = JWT_BLOCK.exec(creds)?.[1];
  const payload = jwt?.split(".")[1];
  if (!payload) throw invalid("the credentials file holds no user JWT");
  try {
    const claims = JSON.parse(Buffer.from(payload, "base64url").toString("utf8")) as { name?: string; nats?: { tags?: string[] } };
    return { name: claims.name ?? "", tags: claims.nats?.tags ?? [] };
  } catch {
    throw invalid("the credentials file's user JWT cannot be decoded");
  }
}

function seedOfCreds(creds: string): Uint8Array | undefined {
  const seed = SEED_BLOCK.exec(creds)?.[1];
  return seed ? new TextEncoder().encode(seed) : undefined;
}

/** Takes every password and token of `s` out of `text`. */
function redact(text: string, s: NatsConnectionSettings): string {
  let out = text;
  for (const secret of [s.password, s.token]) if (secret) out = out.split(secret).join("***");
  for (const url of (s.nats ?? "").split(",")) if (url.includes("@")) out = out.split(url.trim()).join(maskUrl(url.trim()));
  return out;
}

function invalid(message: string): BoxcarError {
  return new BoxcarError(ErrorCode.invalid, message);
}
