/**
 * The page's one connection to NATS, over the server's WebSocket listener: Boxcar's API (the
 * dispatchers' request-reply endpoints, as the principal the page's session names) and live
 * subscriptions to events and output. Nothing else: the page reads no stream or bucket itself.
 */

import type { ApiEndpoint, EventsPage, JobRecord, LogsPage } from "@boxcar/protocol";
import { type Names, names } from "@boxcar/protocol/names";
import { credsAuthenticator, type NatsConnection, type Subscription, wsconnect } from "@nats-io/nats-core";

/** What `/session` answers: where NATS is and who the page is. */
export interface SessionInfo {
  /** The WebSocket URL of NATS. */
  readonly ws: string;
  readonly prefix: string;
  readonly role: string;
  readonly user: string;
  /** A short-lived credential (JWT and seed), when the server authenticates. */
  readonly creds?: string;
  /** When `creds` expires (ms since the epoch); the page asks for a new one before. */
  readonly expiresAt?: number;
  /** Where a tracing UI shows a trace, `{traceId}` in it (`boxcar ui --trace-url`); absent: trace ids are not linked. */
  readonly traceUrl?: string;
}

/** An error the API answered with: its code (`forbidden`, `not_found`, …) and message. */
export class ApiError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

export class Api {
  readonly names: Names;
  /** Told when live updates stop or the connection is being re-made (a message), and when all is well again (undefined). */
  onTrouble: (message: string | undefined) => void = () => {};
  private creds: Uint8Array;

  private constructor(
    private readonly nc: NatsConnection,
    readonly session: SessionInfo,
    creds: Uint8Array,
  ) {
    this.names = names(session.prefix);
    this.creds = creds;
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type === "disconnect" || status.type === "reconnecting") this.onTrouble("connection to NATS lost: reconnecting…");
        else if (status.type === "reconnect") this.onTrouble(undefined);
      }
    })();
  }

  static async connect(session: SessionInfo): Promise<Api> {
    const holder: { api?: Api } = {};
    const initial = encoder.encode(session.creds ?? "");
    const nc = await wsconnect({
      servers: session.ws,
      name: `boxcar-ui-${session.user}`,
      // A user may read only its own inboxes (`_INBOX.<user>`).
      inboxPrefix: `_INBOX.${session.user}`,
      maxReconnectAttempts: -1,
      // Other servers' WebSocket URLs, as a cluster advertises them, are not for this page (and its CSP allows one).
      ignoreClusterUpdates: true,
      ...(session.creds ? { authenticator: credsAuthenticator(() => holder.api?.creds ?? initial) } : {}),
    });
    holder.api = new Api(nc, session, initial);
    return holder.api;
  }

  /** A new short-lived credential, used from the next (re)connection on. */
  renew(creds: string): void {
    this.creds = encoder.encode(creds);
  }

  /** Whether the page's role may ask for `endpoint` on any job (admin), on its own (submitter), or not at all. */
  mayAct(owner: string | undefined): boolean {
    const { role, user } = this.session;
    return role === "admin" || (role === "submitter" && (owner ?? "local") === user);
  }

  /** Whether the page's principal may follow the events of `owner`'s jobs and runs live (a submitter only its own). */
  mayFollow(owner: string | undefined): boolean {
    const { role, user } = this.session;
    return role !== "submitter" || (owner ?? "local") === user;
  }

  /** Whether the page's principal may decide an approval step (docs/workflows.md#approvals): an admin, an approver, or with none named the run's owner. */
  mayDecide(approvers: readonly string[], owner: string | undefined): boolean {
    const { role, user } = this.session;
    if (role === "admin") return true;
    return role === "submitter" && (approvers.length > 0 ? approvers.includes(user) : (owner ?? "local") === user);
  }

  async request<T>(endpoint: ApiEndpoint, body: unknown = {}): Promise<T> {
    const identity = { role: this.session.role as "viewer", user: this.session.user };
    const msg = await this.nc.request(this.names.subjects.api(identity, endpoint), encoder.encode(JSON.stringify(body)), {
      timeout: 15_000,
    });
    const reply = JSON.parse(decoder.decode(msg.data)) as { ok: true; data: T } | { ok: false; error: { code: string; message: string } };
    if (!reply.ok) throw new ApiError(reply.error.code, reply.error.message);
    return reply.data;
  }

  getJob(id: string): Promise<JobRecord> {
    return this.request<{ job: JobRecord }>("jobs.get", { id }).then((r) => r.job);
  }

  /** Calls `onMessage` with each message's JSON on `subject` until the returned function is called. */
  follow<T>(subject: string, onMessage: (value: T, subject: string) => void): () => void {
    const sub: Subscription = this.nc.subscribe(subject, {
      callback: (err, msg) => {
        if (err) return this.onTrouble(`live updates on ${subject} stopped: ${err.message}`);
        try {
          onMessage(JSON.parse(decoder.decode(msg.data)) as T, msg.subject);
        } catch {
          // Not JSON: nothing a page shows.
        }
      },
    });
    return () => sub.unsubscribe();
  }

  /** Calls `onData` with each chunk of output published on `subject` (raw bytes, not JSON). */
  followBytes(subject: string, onData: (data: Uint8Array, subject: string) => void): () => void {
    const sub = this.nc.subscribe(subject, {
      callback: (err, msg) => (err ? this.onTrouble(`live updates on ${subject} stopped: ${err.message}`) : onData(msg.data, msg.subject)),
    });
    return () => sub.unsubscribe();
  }

  /** Reads every page of a job's or run's event history. */
  async history(endpoint: "jobs.events" | "workflows.events", id: string): Promise<{ events: EventsPage["events"]; last: number }> {
    const events: EventsPage["events"] = [];
    let after = 0;
    for (;;) {
      const page = await this.request<EventsPage>(endpoint, { id, after });
      events.push(...page.events);
      after = page.last;
      if (!page.more) return { events, last: after };
    }
  }

  /** Reads the stored output of a job, every page; `onPage` sees each page's text as it comes. */
  async logs(id: string, onChunk: (stream: "stdout" | "stderr", text: string) => void): Promise<number> {
    let after = 0;
    const utf8 = new TextDecoder();
    for (;;) {
      const page = await this.request<LogsPage>("jobs.logs", { id, after });
      for (const chunk of page.chunks) onChunk(chunk.stream, utf8.decode(base64Bytes(chunk.data), { stream: true }));
      after = page.last;
      if (!page.more) return after;
    }
  }

  /** Reads one artifact a chunk at a time and checks its size and digest. */
  async artifact(id: string, path: string): Promise<Blob> {
    const parts: Uint8Array[] = [];
    let after = 0;
    let received = 0;
    for (;;) {
      const chunk = await this.request<{ data: string; size: number; digest: string; last: number; more: boolean }>("jobs.artifact", {
        id,
        path,
        after,
      });
      const bytes = base64Bytes(chunk.data);
      parts.push(bytes);
      received += bytes.length;
      after = chunk.last;
      if (!chunk.more) {
        const whole = new Blob(parts as BlobPart[]);
        if (received !== chunk.size) throw new Error(`${path}: got ${received} bytes, the store holds ${chunk.size}`);
        await checkDigest(whole, chunk.digest, path);
        return whole;
      }
    }
  }

  async close(): Promise<void> {
    await this.nc.close();
  }

  /** Resolves when the connection closes; `err` says why, when it was not asked for. */
  closed(): Promise<Error | undefined> {
    return this.nc.closed().then((err) => err ?? undefined);
  }
}

function base64Bytes(text: string): Uint8Array {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** Checks an Object Store digest (`SHA-256=` and base64, URL-safe or not); outside a secure context a browser cannot hash, and the check is skipped. */
async function checkDigest(blob: Blob, digest: string, path: string): Promise<void> {
  if (!globalThis.crypto?.subtle) return;
  const hash = new Uint8Array(await crypto.subtle.digest("SHA-256", await blob.arrayBuffer()));
  const normal = (s: string) => s.replaceAll("-", "+").replaceAll("_", "/").replace(/=+$/, "");
  const actual = btoa(String.fromCharCode(...hash));
  if (!digest.startsWith("SHA-256=") || normal(digest.slice(8)) !== normal(actual)) {
    throw new Error(`${path}: the download does not match the stored digest`);
  }
}
