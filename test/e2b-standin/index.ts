import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ControlPlane, createApiHandler } from "./api.js";
import { createEnvdHandler } from "./envd.js";
import type { StandInSandbox, StandInTemplate } from "./sandbox.js";

export type { KillReason, StandInSandbox, StandInSandboxState, StandInTemplate } from "./sandbox.js";

/** The one API key the stand-in accepts unless told otherwise; any other gets 401. */
export const STANDIN_API_KEY = "e2b_standin_0123456789abcdef0123456789abcdef";

export interface E2BStandInOptions {
  apiKey?: string;
  /** Templates by name; default `base` (2 CPUs, 512 MB, numbers that are reported, not enforced). */
  templates?: Record<string, StandInTemplate>;
  /** Running sandboxes allowed at once; default unlimited. */
  maxRunning?: number;
  /** The envd version reported for sandboxes, which decides some SDK behaviour; default 0.5.7. */
  envdVersion?: string;
  /** The address to listen on; default 127.0.0.1 (0.0.0.0 lets containers reach it). */
  host?: string;
}

export interface E2BStandIn extends AsyncDisposable {
  /** For the SDK's `apiUrl` (`E2B_API_URL`). */
  readonly apiUrl: string;
  /** For the SDK's `sandboxUrl` (`E2B_SANDBOX_URL`): every sandbox's daemon behind one URL. */
  readonly sandboxUrl: string;
  readonly apiKey: string;
  /** Running sandboxes allowed at once; may be changed while running. */
  maxRunning: number;
  /** Every sandbox created so far, killed ones included. */
  sandboxes(): StandInSandbox[];
  /** Kills every sandbox and stops listening. Safe to call twice. */
  close(): Promise<void>;
}

/**
 * A local stand-in for E2B, on two free ports (of 127.0.0.1 unless told): the control-plane API and the
 * sandbox daemon. Sandboxes are real folders and real processes on this machine, with no
 * isolation at all (see README.md).
 */
export async function startE2BStandIn(opts: E2BStandInOptions = {}): Promise<E2BStandIn> {
  const root = await mkdtemp(join(tmpdir(), "e2b-standin-"));
  const plane: ControlPlane = {
    apiKey: opts.apiKey ?? STANDIN_API_KEY,
    envdVersion: opts.envdVersion ?? "0.5.7",
    templates: new Map(Object.entries(opts.templates ?? { base: { cpuCount: 2, memoryMB: 512 } })),
    maxRunning: opts.maxRunning ?? Number.POSITIVE_INFINITY,
    sandboxes: new Map(),
    root,
  };
  const host = opts.host ?? "127.0.0.1";
  const api = await listen(createApiHandler(plane), host);
  const envd = await listen(
    createEnvdHandler((id) => plane.sandboxes.get(id)),
    host,
  );
  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= (async () => {
      await Promise.all([...plane.sandboxes.values()].map((s) => s.kill("shutdown")));
      await Promise.all([stop(api), stop(envd)]);
      await rm(root, { recursive: true, force: true });
    })();
    return closed;
  };
  return {
    apiUrl: url(api),
    sandboxUrl: url(envd),
    apiKey: plane.apiKey,
    get maxRunning() {
      return plane.maxRunning;
    },
    set maxRunning(value: number) {
      plane.maxRunning = value;
    },
    sandboxes: () => [...plane.sandboxes.values()],
    close,
    [Symbol.asyncDispose]: close,
  };
}

type Handler = (req: IncomingMessage, res: ServerResponse) => Promise<void>;

async function listen(handler: Handler, host: string): Promise<Server> {
  const server = createServer((req, res) => {
    handler(req, res).catch((err: unknown) => {
      if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" });
      res.end(String(err));
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, host, () => resolve());
  });
  return server;
}

function url(server: Server): string {
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("the stand-in is not listening on a port");
  return `http://127.0.0.1:${address.port}`;
}

function stop(server: Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((resolve) => server.close(() => resolve()));
}
