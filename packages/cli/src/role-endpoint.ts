import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Logger } from "@boxcar/common";
import { UsageError } from "./usage-error.js";

/** The small HTTP endpoints a role may open beside its work. */
export type EndpointName = "health" | "metrics";

/** `HOST:PORT` to listen on; port 0 picks a free one (the log says which). */
export interface ListenAddress {
  host: string;
  port: number;
}

/**
 * Where a role's `health` or `metrics` endpoint (or another HTTP server) listens: `--<name>
 * HOST:PORT`, else `$BOXCAR_<NAME>`, else the config file's `<name>`; checked; undefined when
 * none is set.
 */
export function listenAddressFrom(name: string, flag: unknown, env: NodeJS.ProcessEnv, file?: string): ListenAddress | undefined {
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
 * The HTTP server under a role's health or metrics endpoint. A probe or a scrape is one small
 * request, so nothing may hold a connection open for long; an address that cannot be bound is a
 * usage error naming the flag, and the address bound is logged ("<name> endpoint listening").
 */
export class RoleEndpoint implements AsyncDisposable {
  private readonly server;

  constructor(
    private readonly name: EndpointName,
    private readonly log: Logger,
    answer: (req: IncomingMessage, res: ServerResponse) => void,
  ) {
    this.server = createServer(answer);
    this.server.requestTimeout = 5_000;
    this.server.headersTimeout = 5_000;
    this.server.keepAliveTimeout = 1_000;
  }

  async listen(address: ListenAddress): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once("error", (err) => reject(new UsageError(`--${this.name} ${address.host}:${address.port}: ${err.message}`)));
      this.server.listen(address.port, address.host, resolve);
    });
    const bound = this.server.address() as AddressInfo;
    this.log.info({ [this.name]: `${bound.address}:${bound.port}` }, `${this.name} endpoint listening`);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
