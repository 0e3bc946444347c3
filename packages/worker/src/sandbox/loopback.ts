/**
 * A connection to a port on this machine's loopback, as a host session's tunnel opens it
 * (docs/sessions.md#ports): 127.0.0.1, else ::1 (a server that listens on `localhost` may take
 * either). A Docker session's helper does the same inside its container (helper/session-helper.cjs).
 */

import { connect, type Socket } from "node:net";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";

/** How long a connection to a session's port may take to open. */
export const CONNECT_TIMEOUT_MS = 10_000;

/** The loopback addresses tried, in order. */
const LOOPBACK = ["127.0.0.1", "::1"] as const;

/** Opens a connection to `port` on the loopback (half-open allowed: each way ends on its own). */
export async function connectLoopback(port: number): Promise<Socket> {
  let refused: Error | undefined;
  for (const host of LOOPBACK) {
    try {
      return await connectTo(host, port);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      // Nothing there, or no such address (a machine without IPv6): the next one.
      if (code !== "ECONNREFUSED" && code !== "EADDRNOTAVAIL" && code !== "EAFNOSUPPORT") throw refusal(port, err as Error);
      refused ??= err as Error;
    }
  }
  throw refusal(port, refused);
}

/** Why a connection to `port` failed, as the caller is told. */
export function refusal(port: number, err: Error | undefined, code?: string): BoxcarError {
  const why = code ?? (err as NodeJS.ErrnoException | undefined)?.code;
  if (why === "ECONNREFUSED" || why === "EADDRNOTAVAIL" || why === "EAFNOSUPPORT") {
    return new BoxcarError(
      ErrorCode.unavailable,
      `nothing listens on port ${port} in the session (127.0.0.1 and ::1 refused the connection)`,
    );
  }
  if (why === "ETIMEDOUT") {
    return new BoxcarError(
      ErrorCode.unavailable,
      `port ${port} in the session did not take the connection within ${CONNECT_TIMEOUT_MS / 1000} s`,
    );
  }
  return new BoxcarError(ErrorCode.unavailable, `cannot connect to port ${port} in the session: ${err?.message ?? why ?? "it failed"}`);
}

function connectTo(host: string, port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host, port, allowHalfOpen: true });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(Object.assign(new Error(`no answer from ${host}:${port}`), { code: "ETIMEDOUT" }));
    }, CONNECT_TIMEOUT_MS);
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.removeAllListeners("error");
      // Until its user listens: whoever takes it hears its errors (a pipeline does).
      socket.on("error", () => {});
      resolve(socket);
    });
    socket.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}
