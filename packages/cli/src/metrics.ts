import type { IncomingMessage, ServerResponse } from "node:http";
import type { Logger } from "@boxcar/common";
import { collectDefaultMetrics, Registry } from "prom-client";
import { type ListenAddress, RoleEndpoint } from "./role-endpoint.js";

/**
 * A role's Prometheus endpoint (`--metrics HOST:PORT`): `GET /metrics` answers the text
 * exposition format with the role's metrics and the Node.js process's (CPU, memory, event loop
 * lag). Nothing else is served. The numbers carry agent and pool names, states and error codes,
 * never job ids or users: expose it to whoever may see those (docs/security.md).
 */
export class MetricsEndpoint implements AsyncDisposable {
  readonly registry = new Registry();
  private readonly endpoint: RoleEndpoint;

  private constructor(private readonly log: Logger) {
    this.endpoint = new RoleEndpoint("metrics", log, (req, res) => void this.answer(req, res));
  }

  /**
   * The endpoint listening on `address`; none without an address, so a role started without
   * `--metrics` collects nothing (the process metrics watch the event loop and the GC).
   */
  static async open(address: ListenAddress | undefined, log: Logger): Promise<MetricsEndpoint | undefined> {
    if (!address) return undefined;
    const endpoint = new MetricsEndpoint(log);
    await endpoint.endpoint.listen(address);
    collectDefaultMetrics({ register: endpoint.registry });
    return endpoint;
  }

  private async answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "").split("?")[0];
    if (path !== "/metrics") return send(res, 404, "text/plain", "not found: try /metrics\n");
    if (req.method !== "GET" && req.method !== "HEAD") return send(res, 405, "text/plain", "only GET and HEAD\n");
    try {
      send(res, 200, this.registry.contentType, await this.registry.metrics());
    } catch (err) {
      this.log.warn({ err }, "could not collect metrics");
      send(res, 500, "text/plain", "could not collect metrics\n");
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.endpoint[Symbol.asyncDispose]();
  }
}

function send(res: ServerResponse, status: number, type: string, body: string): void {
  res.writeHead(status, { "content-type": type, "cache-control": "no-store" });
  res.end(body);
}
