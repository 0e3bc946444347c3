/**
 * A session's tunnels (docs/sessions.md#ports): `sessions.connect` opens one TCP connection to a
 * port of the session's own loopback (a Docker session's helper connects inside its container; a
 * host session's worker on its own machine) and relays its bytes over core NATS, on the subjects
 * of the user who asked (`<prefix>.tunnel.<user>.<tunnelId>.in|out`, which only that user and
 * admins may use), each way at most a window unacknowledged (common's `TunnelStream`). At most
 * `MAX_SESSION_TUNNELS` are open at once in a session; all end when it closes.
 */

import { pipeline } from "node:stream";
import { type Logger, TunnelStream } from "@boxcar/common";
import {
  BoxcarError,
  ErrorCode,
  type Names,
  parseWith,
  TUNNEL_CHUNK,
  TUNNEL_WINDOW,
  type TunnelInfo,
  TunnelWay,
  WorkerConnect,
} from "@boxcar/protocol";
import { MAX_SESSION_TUNNELS } from "@boxcar/protocol/internal";
import type { NatsConnection } from "@nats-io/transport-node";
import type { SessionSandbox } from "../sandbox/sandbox.js";

/** A session as its tunnels see it. */
interface TunneledSession {
  readonly sandbox: SessionSandbox;
  readonly tunnels: SessionTunnels;
}

/** The tunnel requests, by the last token of their subject. */
export function tunnelRequests(
  holding: (id: string) => TunneledSession,
  link: () => { nc: NatsConnection; names: Names },
): Record<string, (body: unknown) => Promise<unknown>> {
  return {
    connect: async (body) => {
      const request = parseWith(WorkerConnect, body, "request");
      const held = holding(request.id);
      return { tunnel: await held.tunnels.open(held.sandbox, request, link()) };
    },
  };
}

export class SessionTunnels {
  private readonly byKey = new Map<string, { stream: TunnelStream }>();
  /** Connections being opened: counted toward the bound. */
  private opening = 0;
  private closedWith: string | undefined;

  /** `traffic`: bytes went through one (the session is in use); `log`: where a tunnel's failure is said. */
  constructor(
    private readonly sessionId: string,
    private readonly traffic: () => void,
    private readonly log: Logger,
  ) {}

  /** How many are open. */
  get size(): number {
    return this.byKey.size;
  }

  /** Opens a connection to the request's port in the session and relays it over the tunnel's subjects. */
  async open(
    sandbox: SessionSandbox,
    request: ReturnType<typeof WorkerConnect.parse>,
    { nc, names }: { nc: NatsConnection; names: Names },
  ): Promise<TunnelInfo> {
    const { user, tunnel, port } = request;
    if (!sandbox.connect) {
      throw new BoxcarError(
        ErrorCode.invalid,
        `a port's tunnel is built for Docker and host sessions, not yet for ${sandbox.kind} ones (session ${this.sessionId})`,
      );
    }
    const key = `${user}.${tunnel}`;
    if (this.byKey.has(key)) {
      throw new BoxcarError(ErrorCode.conflict, `tunnel ${tunnel} is open already: each connection takes a fresh id`);
    }
    if (this.byKey.size + this.opening >= MAX_SESSION_TUNNELS) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `session ${this.sessionId} has ${MAX_SESSION_TUNNELS} connections to its ports open, the most it may: close one`,
      );
    }
    this.opening += 1;
    let target: Awaited<ReturnType<NonNullable<SessionSandbox["connect"]>>>;
    try {
      target = await sandbox.connect(port);
    } finally {
      this.opening -= 1;
    }
    if (this.closedWith !== undefined) {
      target.destroy();
      throw new BoxcarError(ErrorCode.conflict, `session ${this.sessionId} closed meanwhile`);
    }
    const info: TunnelInfo = {
      tunnel,
      port,
      in: names.subjects.tunnel(user, tunnel, TunnelWay.in),
      out: names.subjects.tunnel(user, tunnel, TunnelWay.out),
      window: TUNNEL_WINDOW,
      openedAt: new Date().toISOString(),
    };
    // Listening on `in` before the reply goes: the caller sends once it has it.
    const stream = new TunnelStream(nc, {
      send: info.out,
      receive: info.in,
      windowBytes: TUNNEL_WINDOW,
      chunkBytes: TUNNEL_CHUNK,
      onTraffic: this.traffic,
    });
    this.byKey.set(key, { stream });
    // The pipeline says how it ended; an error after it did (a reset once the port's side was done) is no news.
    stream.on("error", () => {});
    target.on("error", () => {});
    stream.open();
    pipeline(stream, target, stream, (err) => {
      if (this.byKey.get(key)?.stream === stream) this.byKey.delete(key);
      if (err) this.log.debug({ err: err.message, session: this.sessionId, port, tunnel }, "a tunnel ended early");
    });
    return info;
  }

  /** Throws, saying why, when tunnel `tunnel` of `user` may not open now (it is open already, the session has as many as it may, or closed). */
  checkRoom(user: string, tunnel: string): void {
    if (this.closedWith !== undefined) throw new BoxcarError(ErrorCode.conflict, `session ${this.sessionId} closed meanwhile`);
    if (this.byKey.has(`${user}.${tunnel}`)) {
      throw new BoxcarError(ErrorCode.conflict, `tunnel ${tunnel} is open already: each connection takes a fresh id`);
    }
    if (this.byKey.size + this.opening >= MAX_SESSION_TUNNELS) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `session ${this.sessionId} has ${MAX_SESSION_TUNNELS} tunnels (connections to its ports, shells) open, the most it may: close one`,
      );
    }
  }

  /** Keeps a tunnel opened elsewhere (a shell's) among the session's: counted toward the bound, and ended when the session closes. */
  adopt(user: string, tunnel: string, stream: TunnelStream): void {
    this.checkRoom(user, tunnel);
    const key = `${user}.${tunnel}`;
    this.byKey.set(key, { stream });
    stream.once("close", () => {
      if (this.byKey.get(key)?.stream === stream) this.byKey.delete(key);
    });
  }

  /** Ends every tunnel (the session closes): the callers are told why. */
  closeAll(reason: string): void {
    this.closedWith = reason;
    for (const { stream } of this.byKey.values()) stream.destroy(new Error(reason));
    this.byKey.clear();
  }
}
