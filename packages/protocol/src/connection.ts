import { z } from "zod";

/**
 * How to reach and log in to NATS: the options of the `nats` CLI, taken by every role and every
 * command as flags (`--creds`), environment variables (`NATS_CREDS`) and worker config keys
 * (`creds:`). Files are paths; nothing here is ever logged.
 */
export const NatsConnectionSettings = z.strictObject({
  nats: z.string().min(1).optional().describe("NATS URL, or several comma-separated; BOXCAR_NATS_URL and --nats override it"),
  context: z
    .string()
    .regex(/^[A-Za-z0-9_.-]+$/, "a context name has no slashes")
    .optional()
    .describe("a `nats` CLI context"),
  creds: z.string().min(1).optional().describe("a credentials file (user JWT and nkey seed)"),
  nkey: z.string().min(1).optional().describe("a file holding a user nkey seed"),
  user: z.string().min(1).optional(),
  password: z.string().min(1).optional(),
  token: z.string().min(1).optional(),
  tlsCert: z.string().min(1).optional().describe("client certificate file (mutual TLS)"),
  tlsKey: z.string().min(1).optional().describe("client key file (mutual TLS)"),
  tlsCa: z.string().min(1).optional().describe("CA file that signed the server's certificate"),
  tlsFirst: z.boolean().optional().describe("TLS handshake before the NATS protocol (servers with handshake_first)"),
});
export type NatsConnectionSettings = z.infer<typeof NatsConnectionSettings>;

/** The environment variables of each setting, the first found winning (the `nats` CLI's own names). */
export const NATS_CONNECTION_ENV: Readonly<Record<keyof NatsConnectionSettings, readonly string[]>> = {
  nats: ["BOXCAR_NATS_URL", "NATS_URL"],
  context: ["NATS_CONTEXT"],
  creds: ["NATS_CREDS"],
  nkey: ["NATS_NKEY"],
  user: ["NATS_USER"],
  password: ["NATS_PASSWORD"],
  token: ["NATS_TOKEN"],
  tlsCert: ["NATS_CERT"],
  tlsKey: ["NATS_KEY"],
  tlsCa: ["NATS_CA"],
  tlsFirst: ["NATS_TLS_FIRST"],
};

/** `nats://user:secret@host` → `nats://user:***@host`; a token alone in the user part is masked too. */
export function maskUrl(url: string): string {
  return url.replace(/^([a-z]+:\/\/)([^@/]*)@/i, (_all, scheme: string, auth: string) => {
    const colon = auth.indexOf(":");
    return `${scheme}${colon >= 0 ? `${auth.slice(0, colon)}:***` : "***"}@`;
  });
}
