import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "@boxcar/common";
import type { NatsConnection } from "@nats-io/transport-node";
import { type ListenAddress, RoleEndpoint } from "./role-endpoint.js";

/**
 * Where a role is in its life, as its health endpoint reports it: `starting` until it takes
 * work (or answers the API), `ready` while it does, `draining` once told to stop, `stopped` at
 * the end.
 */
export type RolePhase = "starting" | "ready" | "draining" | "stopped";

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
  private readonly endpoint: RoleEndpoint;

  constructor(log: Logger) {
    this.endpoint = new RoleEndpoint("health", log, (req, res) => this.answer(req, res));
  }

  listen(address: ListenAddress): Promise<void> {
    return this.endpoint.listen(address);
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

  [Symbol.asyncDispose](): Promise<void> {
    return this.endpoint[Symbol.asyncDispose]();
  }
}

function send(res: ServerResponse, status: number, body: Record<string, string>): void {
  res.writeHead(status, { "content-type": "application/json", "cache-control": "no-store" });
  res.end(`${JSON.stringify(body)}\n`);
}
