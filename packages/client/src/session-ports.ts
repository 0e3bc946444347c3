/**
 * A session's ports from here (docs/sessions.md#ports): one connection as a stream
 * (`connectTunnel`, over the caller's own tunnel subjects), and a local port that opens one for
 * each connection it takes (`forwardPort`, what `boxcar session port` runs).
 */

import { randomBytes } from "node:crypto";
import { createServer, type Socket } from "node:net";
import type { Duplex } from "node:stream";
import { pipeline } from "node:stream";
import { TunnelError, TunnelErrorCode, TunnelStream } from "@boxcar/common";
import { ApiEndpoint, BoxcarError, ErrorCode, TUNNEL_CHUNK, TUNNEL_WINDOW, TunnelWay } from "@boxcar/protocol";
import type { DispatcherApi } from "./dispatcher-api.js";

/** How long opening a connection may take: the session's worker tries 127.0.0.1, then ::1, 10 s each at most. */
const CONNECT_WAIT_MS = 45_000;

/** A local port relaying each connection it takes to a port in a session. */
export interface PortForward extends AsyncDisposable {
  /** Where it listens. */
  readonly host: string;
  readonly port: number;
  /** Stops listening and ends the connections it relays. Safe to call twice. */
  close(): Promise<void>;
}

export interface PortForwardOptions {
  /** The local port; default: any free one (`port` says which). */
  localPort?: number;
  /** The local address; default 127.0.0.1 (this machine only). */
  host?: string;
  /** A connection was refused by the session (nothing listens there, say) or its tunnel broke: its local end is closed. */
  onError?: (err: Error) => void;
}

/**
 * A tunnel on the caller's own subjects (`<prefix>.tunnel.<user>.<tunnel>.in|out`), listened on
 * from now, so nothing the session's side sends first is missed; not open until `openTunnel`.
 */
export function newTunnel(api: DispatcherApi, controls?: string[]): { tunnel: string; stream: TunnelStream } {
  const { nc, names } = api.link;
  const tunnel = randomBytes(12).toString("hex");
  const user = api.identity.user;
  const stream = new TunnelStream(nc, {
    send: names.subjects.tunnel(user, tunnel, TunnelWay.in),
    receive: names.subjects.tunnel(user, tunnel, TunnelWay.out),
    windowBytes: TUNNEL_WINDOW,
    chunkBytes: TUNNEL_CHUNK,
    ...(controls ? { controls } : {}),
  });
  return { tunnel, stream };
}

/**
 * Has the session's worker take the other end of `stream` (`ask`, the API request naming the
 * tunnel), then opens it. A refusal of the tunnel's subjects (a credential from before tunnels)
 * is said as such; a stream already ended is one only when `done` says its other end finished.
 */
export async function openTunnel<T>(stream: TunnelStream, ask: () => Promise<T>, done: () => boolean = () => false): Promise<T> {
  // Until it is the caller's: a refused subscription is said below.
  let failed: Error | undefined;
  const early = (err: Error) => {
    failed ??= err;
  };
  stream.on("error", early);
  let reply: T;
  try {
    reply = await ask();
  } catch (err) {
    stream.destroy();
    throw err;
  }
  stream.off("error", early);
  if (failed || (stream.destroyed && !done())) {
    stream.destroy();
    throw new BoxcarError(
      ErrorCode.forbidden,
      `the tunnel's subjects were refused (${failed?.message ?? "closed"}): a credential minted before tunnels needs the account pushed again (boxcar auth push)`,
      { cause: failed },
    );
  }
  stream.open();
  return reply;
}

/** Opens one connection to `port` on session `id`'s loopback, as a stream. */
export async function connectTunnel(api: DispatcherApi, id: string, port: number): Promise<Duplex> {
  const { tunnel, stream } = newTunnel(api);
  await openTunnel(stream, () => api.request(ApiEndpoint.sessionsConnect, { id, port, tunnel }, Math.max(api.timeoutMs, CONNECT_WAIT_MS)));
  return stream;
}

/** Listens on a local port and relays each connection it takes through a tunnel `connect` opens. */
export async function forwardPort(connect: () => Promise<Duplex>, opts: PortForwardOptions = {}): Promise<PortForward> {
  const host = opts.host ?? "127.0.0.1";
  const sockets = new Set<Socket>();
  const said = (err: Error) => {
    // A local client that went away, or a session's server that dropped a connection, is no news.
    if (err instanceof TunnelError && err.code === TunnelErrorCode.reset) return;
    if ((err as NodeJS.ErrnoException).code === "ERR_STREAM_PREMATURE_CLOSE" || (err as NodeJS.ErrnoException).code === "ECONNRESET")
      return;
    opts.onError?.(err);
  };
  // Held still until its tunnel is open: what the local client sends first waits for it.
  const server = createServer({ allowHalfOpen: true, pauseOnConnect: true }, (socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.on("error", () => {});
    connect().then(
      (tunnel) => {
        if (socket.destroyed) {
          tunnel.destroy();
          return;
        }
        // The pipeline says how it ended; an error after it did is no news.
        tunnel.on("error", () => {});
        pipeline(socket, tunnel, socket, (err) => {
          if (err) said(err);
        });
      },
      (err: Error) => {
        socket.destroy();
        opts.onError?.(err);
      },
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.localPort ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const address = server.address();
  const port = typeof address === "object" && address ? address.port : (opts.localPort ?? 0);
  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= new Promise<void>((resolve) => {
      server.close(() => resolve());
      for (const socket of sockets) socket.destroy();
    });
    return closed;
  };
  return { host, port, close, [Symbol.asyncDispose]: close };
}
