import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Logger } from "@boxcar/client";
import type { NatsConnection } from "@nats-io/transport-node";
import { UsageError } from "./usage-error.js";

/**
 * Where a role is in its life, as its health endpoint reports it: `starting` until it takes
 * work (or answers the API), `ready` while it does, `draining` once told to stop, `stopped` at
 * the end.
 */
export type RolePhase = "starting" | "ready" | "draining" | "stopped";

/** `HOST:PORT` to listen on; port 0 picks a free one (the log says which). */
export interface ListenAddress {
  host: string;
  port: number;
}

/**
 * Where a role's `health` or `metrics` endpoint listens: `--<name> HOST:PORT`, else
 * `$BOXCAR_<NAME>`, else the config file's `<name>`; checked; undefined when none is set.
 */
export function listenAddressFrom(
  name: "health" | "metrics",
  flag: unknown,
  env: NodeJS.ProcessEnv,
  file?: string,
): ListenAddress | undefined {
  const variable = `BOXCAR_${name.toUpperCase()}`;
  const [source, value] = flag !== undefined ? [`--${name}`, String(flag)] : env[variable] ? [variable, env[variable]] : [name, file];
  if (value === undefined) return undefined;
  const match = /^(.+):(\d{1,5})$/.exec(value);
  const port = match ? Number(match[2]) : Number.NaN;
  if (!match || port > 65_535) {
    throw new UsageError(`${source} must be HOST:PORT, such as 127.0.0.1:8080 or 0.0.0.0:8080, got ${JSON.stringify(value)}`);
  }
  return { host: (match[1] as string).replace(/^\[(.*)\]$/, "$1"), port };
}

/**
 * A role's health endpoint, for Compose health checks and Kubernetes probes: `GET /healthz`
 * (liveness) answers 200 for as long as the process runs and its event loop turns, and
 * `GET /readyz` (readiness) answers 200 only while the role is `ready` and connected to NATS,
 * else 503 with what it waits for. The bodies carry nothing but those states: no ids, no
 * names, no counts. Any other path or method is a 404 or 405.
 */
export class HealthEndpoint implements AsyncDisposable {
  private phase: () => RolePhase = () => "starting";
  private natsConnected = false;
  private readonly server = createServer((req, res) => this.answer(req, res));

  constructor(private readonly log: Logger) {
    // A probe is one small request: nothing may hold a connection open for long.
    this.server.requestTimeout = 5_000;
    this.server.headersTimeout = 5_000;
    this.server.keepAliveTimeout = 1_000;
  }

  async listen(address: ListenAddress): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once("error", (err) => reject(new UsageError(`--health ${address.host}:${address.port}: ${err.message}`)));
      this.server.listen(address.port, address.host, resolve);
    });
    const bound = this.server.address() as AddressInfo;
    this.log.info({ health: `${bound.address}:${bound.port}` }, "health endpoint listening");
  }

  /** Where the role's phase comes from. */
  report(phase: () => RolePhase): void {
    this.phase = phase;
  }

  /** Follows the role's connection: not ready while it is cut off and reconnecting. */
  follow(nc: NatsConnection): void {
    this.natsConnected = !nc.isClosed();
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type === "disconnect" || status.type === "close") this.natsConnected = false;
        else if (status.type === "reconnect") this.natsConnected = true;
      }
      this.natsConnected = false;
    })();
  }

  private answer(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? "").split("?")[0];
    const phase = this.phase();
    if (path !== "/healthz" && path !== "/readyz") send(res, 404, { error: "not found: try /healthz or /readyz" });
    else if (req.method !== "GET" && req.method !== "HEAD") send(res, 405, { error: "only GET and HEAD" });
    else if (path === "/healthz") send(res, phase === "stopped" ? 503 : 200, { status: phase === "stopped" ? "stopped" : "alive" });
    else this.answerReadiness(res, phase);
  }

  private answerReadiness(res: ServerResponse, phase: RolePhase): void {
    const nats = this.natsConnected ? "connected" : "disconnected";
    const ready = phase === "ready" && this.natsConnected;
    send(res, ready ? 200 : 503, { status: phase, nats });
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

function send(res: ServerResponse, status: number, body: Record<string, string>): void {
  res.writeHead(status, { "content-type": "application/json", "cache-control": "no-store" });
  res.end(`${JSON.stringify(body)}\n`);
}
