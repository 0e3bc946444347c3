import { AuthDir, checkHost, pushAccount } from "@boxcar/auth";
import type { ResolvedConnection } from "@boxcar/client";
import { ROLES, Role } from "@boxcar/protocol";
import type { Command } from "../command.js";
import { connectionFrom } from "../context.js";
import { ExitCode } from "../exit-codes.js";
import { json, table } from "../output.js";
import { UsageError } from "../usage-error.js";

const usage =
  "boxcar auth init DIR [--listen 127.0.0.1:4222] [--store DIR] [--tls-host NAME]... [--no-tls] | add USER [--role] ROLE | ls | revoke USER | rotate USER [--now|--finish] | push | tls [--tls-host NAME]...  [--dir DIR]";

/** `--tls-host` values, checked: names or addresses a server certificate may carry. */
function tlsHosts(values: Record<string, unknown>): string[] {
  const hosts = (values["tls-host"] as string[] | undefined) ?? [];
  for (const host of hosts) {
    const problem = checkHost(host);
    if (problem) throw new UsageError(`--tls-host: ${problem}`);
  }
  return hosts;
}

/** Where the auth folder is for every verb but `init`: `--dir`, else `$BOXCAR_AUTH_DIR`, else `.boxcar/auth`. */
function authDir(values: Record<string, unknown>, env: NodeJS.ProcessEnv): string {
  return (values.dir as string | undefined) ?? env.BOXCAR_AUTH_DIR ?? ".boxcar/auth";
}

/** Sends the auth folder's account to the servers the command names (with their CA, if any). */
function push(a: AuthDir, connection: ResolvedConnection): Promise<void> {
  return pushAccount(a, connection.servers, connection.settings.tlsCa ? { tlsCa: connection.settings.tlsCa } : {});
}

export const auth: Command = {
  usage,
  maxArgs: 3,
  options: {
    dir: { type: "string" },
    role: { type: "string" },
    listen: { type: "string" },
    store: { type: "string" },
    now: { type: "boolean" },
    finish: { type: "boolean" },
    "tls-host": { type: "string", multiple: true, default: [] },
    "no-tls": { type: "boolean" },
  },
  async run(ctx) {
    const [verb, arg] = ctx.positionals;
    if (verb !== "add" && ctx.positionals.length > 2)
      throw new UsageError(`unexpected argument "${ctx.positionals[2]}"\n\nusage: ${usage}`);
    const needArg = (what: string) => {
      if (!arg) throw new UsageError(`auth ${verb} needs ${what}\n\nusage: ${usage}`);
      return arg;
    };
    switch (verb) {
      case "init": {
        const dir = needArg("DIR");
        const hosts = tlsHosts(ctx.values);
        if (ctx.values["no-tls"] && hosts.length > 0) throw new UsageError("--tls-host names the servers' certificate: not with --no-tls");
        const a = await AuthDir.init(dir, {
          ...(ctx.values.prefix ? { prefix: ctx.values.prefix } : {}),
          ...(ctx.values.listen ? { listen: ctx.values.listen as string } : {}),
          ...(ctx.values.store ? { storeDir: ctx.values.store as string } : {}),
          tls: ctx.values["no-tls"] ? false : { hosts },
        });
        if (ctx.values.json) {
          ctx.print(
            json({ dir: a.dir, account: a.accountKey, users: a.users(), tls: a.caFile ? { ca: a.caFile, hosts: a.tlsHosts } : null }),
          );
          return ExitCode.ok;
        }
        ctx.print(`auth folder ${a.dir} (prefix ${a.prefix}):`);
        ctx.print(`  nats-server -c ${a.dir}/nats-server.conf      # or include ${a.dir}/auth.conf in your own config`);
        if (a.caFile) {
          ctx.print(`  ${a.caFile}  (the CA: give clients --tls-ca this file; connect with tls://)`);
          ctx.print(
            `  ${a.dir}/tls/server.pem, server-key.pem  (the servers' certificate, for ${a.tlsHosts.length} names: boxcar auth tls --tls-host NAME adds one)`,
          );
        }
        for (const role of ROLES) ctx.print(`  ${a.credsFile(role)}  (${role})`);
        ctx.print(`  ${a.dir}/dispatchers.pub  (give workers --dispatcher-keys this file)`);
        ctx.print(`  account ${a.accountKey}  (its public key, and its name: KEDA's account)`);
        return ExitCode.ok;
      }
      case "tls": {
        if (arg) throw new UsageError(`unexpected argument "${arg}"\n\nusage: ${usage}`);
        const a = await AuthDir.open(authDir(ctx.values, ctx.io.env));
        await a.issueServerCertificate([...a.tlsHosts, ...tlsHosts(ctx.values)]);
        ctx.print(
          ctx.values.json
            ? json({ cert: `${a.dir}/tls/server.pem`, hosts: a.tlsHosts })
            : `a new server certificate in ${a.dir}/tls/server.pem for ${a.tlsHosts.join(", ")}: restart or reload (nats-server --signal reload) the servers`,
        );
        return ExitCode.ok;
      }
      case "add": {
        const user = needArg("USER");
        // `auth add alice --role submitter`, or `auth add alice submitter`
        const [, , roleArg] = ctx.positionals;
        if (roleArg !== undefined && ctx.values.role !== undefined) throw new UsageError("give the role once: --role ROLE or a third word");
        const parsed = Role.safeParse(ctx.values.role ?? roleArg);
        if (!parsed.success) throw new UsageError(`--role must be one of ${ROLES.join(", ")}, got ${String(ctx.values.role)}`);
        const a = await AuthDir.open(authDir(ctx.values, ctx.io.env));
        const file = await a.mint(user, parsed.data);
        ctx.print(ctx.values.json ? json({ user, role: parsed.data, creds: file }) : `user ${user} (${parsed.data}): ${file}`);
        return ExitCode.ok;
      }
      case "ls": {
        const a = await AuthDir.open(authDir(ctx.values, ctx.io.env));
        if (ctx.values.json) ctx.print(json(a.users()));
        else
          ctx.print(
            table(
              ["USER", "ROLE", "STATE", "CREATED", "PUBLIC KEY"],
              a
                .users()
                .map((u) => [
                  u.name,
                  u.role,
                  u.revokedAt ? `revoked ${u.revokedAt}` : u.retiringSince ? `retiring since ${u.retiringSince}` : "live",
                  u.createdAt,
                  u.publicKey,
                ]),
            ),
          );
        return ExitCode.ok;
      }
      case "revoke":
      case "rotate": {
        const user = needArg("USER");
        const a = await AuthDir.open(authDir(ctx.values, ctx.io.env));
        const { now, finish } = ctx.values as { now?: boolean; finish?: boolean };
        if (now && finish) throw new UsageError("auth rotate takes --now or --finish, not both");
        if (verb === "revoke" && (now || finish)) throw new UsageError("--now and --finish are for auth rotate");
        let done: string;
        if (verb === "revoke") {
          await a.revoke(user);
          done = `user ${user} revoked`;
        } else if (finish) {
          await a.finishRotation(user);
          done = `user ${user}'s old key revoked; only ${a.credsFile(user)} works now`;
        } else if (now) {
          await a.rotate(user, { now: true });
          done = `user ${user} has a new key in ${a.credsFile(user)}; the old one is revoked`;
        } else {
          await a.rotate(user);
          done =
            `user ${user} has a new key in ${a.credsFile(user)}; the old one works until \`boxcar auth rotate ${user} --finish\`` +
            (a.users().find((u) => u.name === user)?.role === "dispatcher"
              ? ` (${a.dir}/dispatchers.pub lists both: workers re-read it)`
              : "");
        }
        const connection = connectionFrom(ctx.values, ctx.io.env);
        try {
          await push(a, connection);
        } catch (err) {
          ctx.io.stderr.write(
            `${done} in ${a.dir}/auth.conf, but the running servers were not told: ${(err as Error).message}\n` +
              "Run `boxcar auth push` against them, or restart them with the new auth.conf.\n",
          );
          return ExitCode.unavailable;
        }
        ctx.print(`${done}; the servers at ${connection.servers.length} URL(s) have the update`);
        return ExitCode.ok;
      }
      case "push": {
        const a = await AuthDir.open(authDir(ctx.values, ctx.io.env));
        await push(a, connectionFrom(ctx.values, ctx.io.env));
        ctx.print("account pushed");
        return ExitCode.ok;
      }
      default:
        throw new UsageError(`auth needs one of init, add, ls, revoke, rotate, push\n\nusage: ${usage}`);
    }
  },
};
