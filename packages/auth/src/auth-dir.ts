import { chmod, mkdir, readFile, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { BoxcarError, ErrorCode, LOCAL_OWNER, names, ROLE_TAG, ROLES, type Role, rolePermissions, UserName } from "@boxcar/protocol";
import { Algorithms, decode, encodeAccount, encodeOperator, encodeUser, fmtCreds, newScopedSigner } from "@nats-io/jwt";
import { createAccount, createOperator, createUser, fromSeed, type KeyPair } from "@nats-io/nkeys";
import { z } from "zod";
import { DEFAULT_SERVER_HOSTS, newAuthority, newServerCertificate } from "./tls.js";

/**
 * An auth folder: the keys and credentials of one Boxcar system under NATS decentralised
 * (JWT) authentication. An operator signs one system account and one Boxcar account; the Boxcar
 * account has one scoped signing key per role, whose permission template (`rolePermissions`)
 * fixes what every user minted under that role may publish and subscribe to, with the user's
 * name filled in by the server. Minting a user needs no server change; revoking one updates
 * the account and pushes it to the running servers.
 *
 * Layout (every file 0600, folders 0700):
 * - `nats-server.conf`: runs as is (`nats-server -c`), or include `auth.conf` in your own;
 * - `auth.conf`: operator, system account, resolver and the accounts' JWTs;
 * - `<user>.creds`: one credentials file per user; `boxcar auth init` makes one per role;
 * - `dispatchers.pub`: the public keys workers accept work items from (`--dispatcher-keys`);
 * - `auth.json`: the users and public keys; `keys/`: the operator, account and role seeds, and
 *   the private key of the system's certificate authority (`ca.key`);
 * - `tls/`: the CA's certificate (`ca.pem`, what roles and clients verify servers with) and the
 *   servers' certificate and key (`server.pem`, `server-key.pem`), unless made without TLS.
 */

const User = z.strictObject({
  name: UserName,
  role: z.enum(ROLES as [Role, ...Role[]]),
  publicKey: z.string(),
  createdAt: z.iso.datetime(),
  revokedAt: z.iso.datetime().optional(),
  /** A key being rotated out: still live until `finishRotation` revokes it. */
  retiringSince: z.iso.datetime().optional(),
});
export type AuthUser = z.infer<typeof User>;

const AuthState = z.strictObject({
  v: z.literal(1),
  prefix: z.string(),
  operator: z.string(),
  systemAccount: z.string(),
  account: z.string(),
  /** The names and addresses the servers' certificate is issued for; absent: made without TLS. */
  tlsHosts: z.array(z.string()).optional(),
  /** Public keys of users revoked and then re-minted under the same name (rotations). */
  revoked: z.record(z.string(), z.number()).default({}),
  users: z.array(User),
});
type AuthState = z.infer<typeof AuthState>;

export interface InitAuthOptions {
  /** The system's prefix; default `boxcar`. Permissions are derived from its names. */
  prefix?: string;
  /** What `nats-server.conf` listens on; default `127.0.0.1:4222`. */
  listen?: string;
  /** JetStream's store in `nats-server.conf`; default `DIR/jetstream`. */
  storeDir?: string;
  /**
   * TLS: a certificate authority, and a certificate for the servers issued for
   * `DEFAULT_SERVER_HOSTS` and these names or addresses (default: none more); false: no TLS.
   */
  tls?: false | { hosts?: readonly string[] };
}

const STATE_FILE = "auth.json";
/** Connections, subscriptions and payloads: unlimited (an account JWT without limits allows no connection). */
const UNLIMITED = { subs: -1, data: -1, payload: -1, imports: -1, exports: -1, wildcards: true, conn: -1, leaf: -1 };
const SYSTEM_USER = "sys";

export class AuthDir {
  private constructor(
    readonly dir: string,
    private state: AuthState,
  ) {}

  /** Creates a new auth folder with one user per role (named after it). Refuses a folder that has one. */
  static async init(dir: string, opts: InitAuthOptions = {}): Promise<AuthDir> {
    const root = resolve(dir);
    const prefix = opts.prefix ?? "boxcar";
    names(prefix); // checks it
    await mkdir(join(root, "keys"), { recursive: true, mode: 0o700 });
    await chmod(root, 0o700);
    const existing = await readFile(join(root, STATE_FILE), "utf8").catch(() => undefined);
    if (existing !== undefined) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `${root} already holds an auth folder; add users with \`boxcar auth add\`, or choose an empty folder`,
      );
    }
    const operator = createOperator();
    const system = createAccount();
    const account = createAccount();
    await writeSeed(root, "operator", operator);
    await writeSeed(root, "system-account", system);
    await writeSeed(root, "account", account);
    for (const role of ROLES) await writeSeed(root, `role-${role}`, createAccount());
    const auth = new AuthDir(root, {
      v: 1,
      prefix,
      operator: operator.getPublicKey(),
      systemAccount: system.getPublicKey(),
      account: account.getPublicKey(),
      revoked: {},
      users: [],
    });
    // The system account's user pushes account updates (revocations) to running servers.
    const sysUser = createUser();
    const sysJwt = await encodeUser(SYSTEM_USER, sysUser, system, {}, { algorithm: Algorithms.v2 });
    await writePrivate(join(root, "keys", `${SYSTEM_USER}.creds`), fmtCreds(sysJwt, sysUser));
    for (const role of ROLES) await auth.mint(role, role);
    if (opts.tls !== false) {
      await mkdir(join(root, "tls"), { recursive: true, mode: 0o700 });
      const authority = newAuthority(`Boxcar ${prefix} CA`);
      await writePrivate(join(root, "keys", "ca.key"), authority.key);
      await writePrivate(join(root, "tls", "ca.pem"), authority.cert);
      await auth.issueServerCertificate(opts.tls?.hosts ?? []);
    }
    await auth.writeServerConfig(opts.listen ?? "127.0.0.1:4222", resolve(opts.storeDir ?? join(root, "jetstream")));
    return auth;
  }

  static async open(dir: string): Promise<AuthDir> {
    const root = resolve(dir);
    let text: string;
    try {
      text = await readFile(join(root, STATE_FILE), "utf8");
    } catch {
      throw new BoxcarError(
        ErrorCode.notFound,
        `${root} is not an auth folder (no ${STATE_FILE}): name yours with --dir DIR or BOXCAR_AUTH_DIR, or create one with \`boxcar auth init DIR\``,
      );
    }
    return new AuthDir(root, AuthState.parse(JSON.parse(text)));
  }

  get prefix(): string {
    return this.state.prefix;
  }

  /** The Boxcar account's public key: its id and its name on the servers (KEDA's `account`). */
  get accountKey(): string {
    return this.state.account;
  }

  users(): readonly AuthUser[] {
    return this.state.users;
  }

  credsFile(user: string): string {
    return join(this.dir, `${user}.creds`);
  }

  /** The CA file that verifies the servers (`--tls-ca`), or undefined for a folder made without TLS. */
  get caFile(): string | undefined {
    return this.state.tlsHosts ? join(this.dir, "tls", "ca.pem") : undefined;
  }

  /** The names and addresses the servers' certificate is issued for (none without TLS). */
  get tlsHosts(): readonly string[] {
    return this.state.tlsHosts ?? [];
  }

  /**
   * Issues the servers a new certificate (`tls/server.pem` and `server-key.pem`) from the folder's
   * CA, for `DEFAULT_SERVER_HOSTS` and `hosts`: to add a name the servers are reached by, or to
   * renew it. Servers take it on a restart or reload; clients need nothing new.
   */
  async issueServerCertificate(hosts: readonly string[]): Promise<void> {
    const caKey = await readFile(join(this.dir, "keys", "ca.key"), "utf8").catch(() => {
      throw new BoxcarError(ErrorCode.notFound, `${this.dir} was made without TLS (no keys/ca.key): make a new folder with TLS`);
    });
    const caCert = await readFile(join(this.dir, "tls", "ca.pem"), "utf8");
    const all = [...new Set([...DEFAULT_SERVER_HOSTS, ...hosts])];
    const server = newServerCertificate({ cert: caCert, key: caKey }, all);
    await writePrivate(join(this.dir, "tls", "server-key.pem"), server.key);
    await writePrivate(join(this.dir, "tls", "server.pem"), server.cert);
    this.state.tlsHosts = all;
    await this.save();
  }

  get systemCredsFile(): string {
    return join(this.dir, "keys", `${SYSTEM_USER}.creds`);
  }

  /** Mints a user under `role` and writes `<user>.creds`; refuses a name already in use. */
  async mint(user: string, role: Role): Promise<string> {
    if (!UserName.safeParse(user).success)
      throw new BoxcarError(ErrorCode.invalid, `a user name is 1-64 letters, digits, '-' or '_', got ${JSON.stringify(user)}`);
    if (user === LOCAL_OWNER) {
      throw new BoxcarError(ErrorCode.invalid, `${LOCAL_OWNER} is reserved: it owns what was made without authentication`);
    }
    const taken = this.state.users.find((u) => u.name === user && !u.revokedAt);
    if (taken)
      throw new BoxcarError(
        ErrorCode.conflict,
        `user ${user} exists (role ${taken.role}); rotate its key with \`boxcar auth rotate ${user}\``,
      );
    const file = await this.writeUser(user, role);
    await this.save();
    return file;
  }

  /**
   * A credential for `user` that expires after `ttlSeconds` (the server drops its connection
   * then), for a process that hands one to somewhere less trusted, as `boxcar ui` does to a
   * browser. `user` must hold a live credential of `role`: revoking the user stops new ones, and
   * those given out end within their lifetime. Not written to disk or to the users' list.
   */
  async mintShortLived(user: string, role: Role, ttlSeconds: number): Promise<string> {
    if (!this.liveKeys(user).some((u) => u.role === role)) {
      throw new BoxcarError(ErrorCode.notFound, `no user ${user} with a live ${role} credential in ${this.dir}`);
    }
    const { jwt, kp } = await this.userJwt(user, role, ttlSeconds);
    return new TextDecoder().decode(fmtCreds(jwt, kp));
  }

  /**
   * Revokes `user`'s credential: servers refuse it from the moment they learn the updated account
   * (`pushAccount`), and the file is kept on record only.
   */
  async revoke(user: string): Promise<void> {
    this.revokeUser(user);
    await this.saveAccount();
  }

  /**
   * Gives `user` a new key in a new `<user>.creds`, same name and role. The old key stays live
   * (and, for a dispatcher, trusted in `dispatchers.pub`) until `finishRotation`, so processes
   * move to the new file one by one; with `now`, it is revoked at once (a leaked key).
   */
  async rotate(user: string, opts: { now?: boolean } = {}): Promise<void> {
    const live = this.liveKeys(user);
    const current = live.find((u) => !u.retiringSince) ?? live[0];
    if (!current) throw new BoxcarError(ErrorCode.notFound, `no user ${user} with a live credential`);
    if (opts.now) {
      for (const key of live) this.revokeKey(key);
    } else {
      if (live.some((u) => u.retiringSince)) {
        throw new BoxcarError(
          ErrorCode.conflict,
          `a rotation of ${user} is under way: finish it with \`boxcar auth rotate ${user} --finish\` (or revoke every old key with --now)`,
        );
      }
      current.retiringSince = new Date().toISOString();
    }
    await this.writeUser(user, current.role);
    await this.saveAccount();
  }

  /** Revokes the keys `rotate` left live for `user`; refuses when no rotation is under way. */
  async finishRotation(user: string): Promise<void> {
    const retiring = this.liveKeys(user).filter((u) => u.retiringSince);
    if (retiring.length === 0) throw new BoxcarError(ErrorCode.conflict, `no rotation of ${user} is under way`);
    for (const key of retiring) this.revokeKey(key);
    await this.saveAccount();
  }

  private liveKeys(user: string): AuthUser[] {
    return this.state.users.filter((u) => u.name === user && !u.revokedAt);
  }

  /** Revokes every live key of `user`. */
  private revokeUser(user: string): void {
    const live = this.liveKeys(user);
    if (live.length === 0) throw new BoxcarError(ErrorCode.notFound, `no user ${user} with a live credential`);
    for (const key of live) this.revokeKey(key);
  }

  /** Puts one key on the account's revocation list. */
  private revokeKey(key: AuthUser): void {
    key.revokedAt = new Date().toISOString();
    delete key.retiringSince;
    this.state.revoked[key.publicKey] = Math.floor(Date.now() / 1000);
  }

  /**
   * The Boxcar account's JWT as it stands: scoped signing keys per role, and revocations.
   *
   * Its name is the account's public key, as its id is. nats-server's monitoring endpoint reports
   * an account's JWT name as `name` in `/jsz` (its key as `id`) and selects accounts with
   * `/jsz?acc=` by key only, while KEDA's nats-jetstream scaler asks `acc=<account>` and, before
   * KEDA 2.17, keeps only the entry whose `name` equals that same `account`: a name other than the
   * key (it was the prefix, `boxcar`) left no value of `account` that matched, so workers never
   * scaled up from zero. Named by its key, `account: <public key>` works in every KEDA (2.17 and
   * later also match `id`). Folders made before keep working; the new name reaches the servers with
   * the next `revoke`, `rotate` or `boxcar auth push`, and on a cluster a server's `/jsz` may keep
   * the old one until that server restarts (test/keda-auth.test.ts).
   */
  async accountJwt(): Promise<string> {
    const operator = await this.seed("operator");
    const account = await this.seed("account");
    const n = names(this.state.prefix);
    const signingKeys = [];
    for (const role of ROLES) {
      const p = rolePermissions(n, role);
      const scoped = newScopedSigner(await this.seed(`role-${role}`), role, {
        pub: { allow: [...p.pub.allow], deny: [...p.pub.deny] },
        sub: { allow: [...p.sub.allow], deny: [...p.sub.deny] },
      });
      // @nats-io/jwt fills in `resp: {max: 0}`, which the server reads as "may answer one message
      // on any reply subject": a caller could then aim a dispatcher's answer at JetStream's API.
      if (p.allowResponses) scoped.template.resp = { max: 1, ttl: 0 };
      else delete scoped.template.resp;
      signingKeys.push(scoped);
    }
    return await encodeAccount(
      account.getPublicKey(),
      account,
      {
        limits: {
          ...UNLIMITED,
          mem_storage: -1,
          disk_storage: -1,
          streams: -1,
          consumer: -1,
          mem_max_stream_bytes: -1,
          disk_max_stream_bytes: -1,
          max_ack_pending: -1,
        },
        signing_keys: signingKeys,
        revocations: { ...this.state.revoked },
      },
      { signer: operator, algorithm: Algorithms.v2 },
    );
  }

  /** The `auth.conf` text: operator mode with a full resolver, the two accounts preloaded. */
  async authConfig(): Promise<string> {
    const operator = await this.seed("operator");
    const system = await this.seed("system-account");
    const operatorJwt = await encodeOperator("boxcar", operator, { system_account: system.getPublicKey() }, { algorithm: Algorithms.v2 });
    const systemJwt = await encodeAccount("SYS", system, { limits: UNLIMITED }, { signer: operator, algorithm: Algorithms.v2 });
    return [
      "# Written by `boxcar auth`; include it in a nats-server config. Holds public JWTs only.",
      `operator: ${operatorJwt}`,
      `system_account: ${system.getPublicKey()}`,
      `resolver: { type: full, dir: ${JSON.stringify(join(this.dir, "jwt"))}, allow_delete: false, interval: "2m" }`,
      "resolver_preload: {",
      `  ${system.getPublicKey()}: ${systemJwt}`,
      `  ${this.state.account}: ${await this.accountJwt()}`,
      "}",
      "",
    ].join("\n");
  }

  /** Public keys of the live dispatcher users: what workers verify work items against. */
  dispatcherKeys(): string[] {
    return this.state.users.filter((u) => u.role === "dispatcher" && !u.revokedAt).map((u) => u.publicKey);
  }

  /** A new key for `user`, and its JWT signed with `role`'s scoped key (expiring `ttlSeconds` after it is issued, if given). */
  private async userJwt(user: string, role: Role, ttlSeconds?: number): Promise<{ jwt: string; kp: KeyPair }> {
    const account = this.state.account;
    const kp = createUser();
    if (ttlSeconds !== undefined && !(Number.isInteger(ttlSeconds) && ttlSeconds > 0)) {
      throw new BoxcarError(ErrorCode.invalid, `a credential's lifetime must be a whole number of seconds above 0, not ${ttlSeconds}`);
    }
    const signer = await this.seed(`role-${role}`);
    for (let tries = 1; ; tries++) {
      // encodeUser stamps its own issue time, a moment after this clock read: should a second
      // begin between the two (a busy machine), the lifetime comes out a second short, and the
      // credential is made again.
      const exp = ttlSeconds === undefined ? undefined : Math.floor(Date.now() / 1000) + ttlSeconds;
      const jwt = await encodeUser(
        user,
        kp,
        account,
        { tags: [`${ROLE_TAG}:${role}`], issuer_account: account },
        { signer, scopedUser: true, algorithm: Algorithms.v2, ...(exp !== undefined ? { exp } : {}) },
      );
      // (A third second begun between the two reads would take a clock stepping under it: kept then.)
      if (exp === undefined || decode(jwt).iat === exp - (ttlSeconds as number) || tries === 3) return { jwt, kp };
    }
  }

  private async writeUser(user: string, role: Role): Promise<string> {
    const { jwt, kp } = await this.userJwt(user, role);
    const file = this.credsFile(user);
    await writePrivate(file, fmtCreds(jwt, kp));
    this.state.users.push({ name: user, role, publicKey: kp.getPublicKey(), createdAt: new Date().toISOString() });
    return file;
  }

  /** Saves the users and rewrites `auth.conf` with the account as it now stands (for servers that restart). */
  private async saveAccount(): Promise<void> {
    await this.save();
    await this.writeAuthConfig();
  }

  private async writeAuthConfig(): Promise<void> {
    await writePrivate(join(this.dir, "auth.conf"), await this.authConfig());
  }

  private async save(): Promise<void> {
    await writePrivate(join(this.dir, STATE_FILE), `${JSON.stringify(this.state, null, 2)}\n`);
    await writePrivate(join(this.dir, "dispatchers.pub"), `${this.dispatcherKeys().join("\n")}\n`);
  }

  private async writeServerConfig(listen: string, storeDir: string): Promise<void> {
    await this.writeAuthConfig();
    await writePrivate(
      join(this.dir, "nats-server.conf"),
      [
        "# Written by `boxcar auth init`: a single nats-server with JetStream and Boxcar's roles.",
        `listen: ${JSON.stringify(listen)}`,
        ...(this.state.tlsHosts
          ? [
              "# Clients connect with TLS only, and verify this server with tls/ca.pem (--tls-ca).",
              `tls { cert_file: ${JSON.stringify(join(this.dir, "tls", "server.pem"))}, key_file: ${JSON.stringify(join(this.dir, "tls", "server-key.pem"))} }`,
            ]
          : []),
        `jetstream { store_dir: ${JSON.stringify(storeDir)} }`,
        "max_payload: 1MB",
        'include "auth.conf"',
        "",
      ].join("\n"),
    );
  }

  private async seed(name: string): Promise<KeyPair> {
    return fromSeed(new TextEncoder().encode((await readFile(join(this.dir, "keys", `${name}.nk`), "utf8")).trim()));
  }
}

async function writeSeed(root: string, name: string, kp: KeyPair): Promise<void> {
  await writePrivate(join(root, "keys", `${name}.nk`), `${new TextDecoder().decode(kp.getSeed())}\n`);
}

/** Writes a file only its owner can read (mode 0600, also when it existed before). */
async function writePrivate(file: string, data: string | Uint8Array): Promise<void> {
  await writeFile(file, data, { mode: 0o600 });
  await chmod(file, 0o600);
}
