import { connect, createServer, type Socket } from "node:net";

export interface TcpProxy extends AsyncDisposable {
  /** Where clients connect: `nats://127.0.0.1:<port>`. */
  readonly url: string;
  readonly port: number;
  /** Client connections accepted so far. */
  readonly accepted: number;
  /**
   * A network partition: from now on no byte goes through in either direction, on the open
   * connections and on any made later, and no socket is closed (an end or reset from one side is
   * not passed on either). The peers see silence, as behind a dead link, not a closed connection.
   */
  blackhole(): void;
}

/**
 * A TCP proxy on 127.0.0.1 (a free port) forwarding every connection to `target` (a
 * `nats://host:port` URL or a port on 127.0.0.1), byte for byte, until {@link TcpProxy.blackhole}.
 */
export async function tcpProxy(target: string | number): Promise<TcpProxy> {
  const { hostname, port: targetPort } =
    typeof target === "number"
      ? { hostname: "127.0.0.1", port: target }
      : { hostname: new URL(target).hostname, port: Number(new URL(target).port) };
  let holed = false;
  let accepted = 0;
  const sockets = new Set<Socket>();
  const track = (socket: Socket) => {
    sockets.add(socket);
    socket.on("error", () => {}); // a peer's reset: nothing to pass on
    socket.once("close", () => sockets.delete(socket));
  };
  const server = createServer((client) => {
    accepted += 1;
    track(client);
    // A connection made during a partition reaches nothing: held open, its bytes dropped.
    if (holed) {
      client.on("data", () => {});
      return;
    }
    const upstream = connect(targetPort, hostname);
    track(upstream);
    // Writes to a socket still connecting are queued by Node, so nothing the client sends early is lost.
    client.on("data", (chunk: Buffer) => {
      if (!holed) upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => {
      if (!holed) client.write(chunk);
    });
    const pass = (to: Socket) => () => {
      if (!holed) to.destroy();
    };
    client.once("close", pass(upstream));
    upstream.once("close", pass(client));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("the proxy has no TCP address");
  return {
    url: `nats://127.0.0.1:${address.port}`,
    port: address.port,
    get accepted() {
      return accepted;
    },
    blackhole() {
      holed = true;
    },
    async [Symbol.asyncDispose]() {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
