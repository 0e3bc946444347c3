import { parseIdentity } from "@boxcar/protocol";
import type { UiServer, UiServerOptions } from "@boxcar/ui";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { listenAddressFrom } from "../role-endpoint.js";
import { UsageError } from "../usage-error.js";

export const ui: Command = {
  usage:
    "boxcar ui --nats-ws ws://HOST:PORT [--listen 127.0.0.1:4280] [--auth-dir DIR --as viewer:NAME|submitter:NAME] [--host-name HOST:PORT|https://HOST]... [--trace-url URL-WITH-{traceId}]",
  maxArgs: 0,
  options: {
    "nats-ws": { type: "string" },
    listen: { type: "string" },
    "auth-dir": { type: "string" },
    as: { type: "string" },
    "host-name": { type: "string", multiple: true, default: [] },
    "trace-url": { type: "string" },
  },
  async run(ctx) {
    const natsWs = (ctx.values["nats-ws"] as string | undefined) ?? ctx.io.env.BOXCAR_NATS_WS;
    if (!natsWs) {
      throw new UsageError(
        "--nats-ws (or BOXCAR_NATS_WS) is needed: the ws:// or wss:// URL browsers reach NATS's WebSocket listener on (docs/dashboard.md shows the server's websocket block)",
      );
    }
    const listen = listenAddressFrom("listen", ctx.values.listen, {}) ?? { host: "127.0.0.1", port: 4280 };
    const authDir = (ctx.values["auth-dir"] as string | undefined) ?? ctx.io.env.BOXCAR_AUTH_DIR;
    const as = ctx.values.as as string | undefined;
    if (as !== undefined && authDir === undefined)
      throw new UsageError("--as needs --auth-dir: the folder whose keys mint the page's credentials");
    if (authDir === undefined && !/^(127\.|localhost$|::1$)/.test(listen.host)) {
      throw new UsageError(
        `--listen ${listen.host}: without --auth-dir the page acts as an open server's admin, for this machine only; give --auth-dir (and --as) to serve it beyond`,
      );
    }
    const traceUrl = ctx.values["trace-url"] as string | undefined;
    const server = await serveDashboard(
      {
        host: listen.host,
        port: listen.port,
        natsWs,
        prefix: (ctx.values.prefix as string | undefined) ?? "boxcar",
        hostNames: ctx.values["host-name"] as string[],
        ...(traceUrl ? { traceUrl } : {}),
        ...(authDir ? { principal: { authDir, ...pagePrincipal(as ?? "viewer:viewer") } } : {}),
        onLoginUrl: (url) => ctx.io.stderr.write(`log in: ${url}  (once; a new link follows each use, and each expiry)\n`),
      },
      "--listen",
    );
    ctx.io.stderr.write(`dashboard on ${server.url}; the NATS websocket listener must allow origins ${server.origins.join(", ")}\n`);
    await new Promise((r) => ctx.io.signal.addEventListener("abort", r, { once: true }));
    await server.close();
    return ExitCode.ok;
  },
};

/** `--as`: a viewer or a submitter; never an admin, whose credential would reach JetStream itself. */
function pagePrincipal(text: string): { role: "viewer" | "submitter"; user: string } {
  const identity = parseIdentity(text);
  if (identity.role !== "viewer" && identity.role !== "submitter") {
    throw new UsageError(
      `--as ${text}: the dashboard acts as a viewer or a submitter; an ${identity.role} credential does not belong in a browser`,
    );
  }
  return { role: identity.role, user: identity.user };
}

/**
 * Starts the dashboard's server; an address in use is a usage error naming `flag`, and a trace
 * URL that is not one (the server checks it) names `--trace-url` or `$BOXCAR_TRACE_URL`.
 */
export async function serveDashboard(opts: UiServerOptions, flag: string): Promise<UiServer> {
  const { startUiServer } = await import("@boxcar/ui");
  try {
    return await startUiServer(opts);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "EADDRINUSE") {
      throw new UsageError(`${flag}: ${opts.host}:${opts.port} is in use; choose another port`);
    }
    if (err instanceof RangeError && err.message.includes("trace URL")) {
      throw new UsageError(`${opts.traceUrl !== undefined ? "--trace-url" : "$BOXCAR_TRACE_URL"}: ${err.message}`);
    }
    throw err;
  }
}
