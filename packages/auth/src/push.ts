import { readFile } from "node:fs/promises";
import { BoxcarError, ErrorCode, maskUrl } from "@boxcar/protocol";
import { connect, credsAuthenticator } from "@nats-io/transport-node";
import type { AuthDir } from "./auth-dir.js";

/**
 * Sends the Boxcar account's current JWT to the running servers (as the system account's user),
 * so a revocation takes effect at once: the server closes the revoked user's connections and
 * refuses it from then on. Servers of a cluster pass the update on to each other.
 */
export async function pushAccount(auth: AuthDir, servers: readonly string[], extra: { tlsCa?: string } = {}): Promise<void> {
  const creds = await readFile(auth.systemCredsFile);
  let nc: Awaited<ReturnType<typeof connect>>;
  try {
    nc = await connect({
      servers: [...servers],
      name: "boxcar-auth",
      authenticator: credsAuthenticator(creds),
      ...(extra.tlsCa ? { tls: { caFile: extra.tlsCa } } : {}),
    });
  } catch (cause) {
    throw new BoxcarError(
      ErrorCode.unavailable,
      `cannot push the account to ${servers.map(maskUrl).join(", ")}: ${(cause as Error).message}`,
      {
        cause,
      },
    );
  }
  try {
    const reply = await nc.request("$SYS.REQ.CLAIMS.UPDATE", await auth.accountJwt(), { timeout: 5_000 });
    const body = reply.json<{ data?: { code?: number; message?: string }; error?: { code?: number; description?: string } }>();
    if (body.error || (body.data?.code !== undefined && body.data.code !== 200)) {
      throw new BoxcarError(
        ErrorCode.internal,
        `the server refused the account update: ${body.error?.description ?? body.data?.message ?? "no reason given"}`,
      );
    }
  } finally {
    await nc.close();
  }
}
