import { type ChildProcess, execFile, spawn } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { AuthDir } from "@boxcar/auth";
import { connectNats, resolveConnection } from "@boxcar/client";
import { findNatsServer, freePort } from "@boxcar/fabric";
import { eventually, scratch } from "@boxcar/testing";
import { jetstreamManager } from "@nats-io/jetstream";
import { afterEach, describe, expect, test } from "vitest";
import { BOXCAR_BIN } from "./helpers/cli.js";

/**
 * TLS from `boxcar auth init`: the CA and the servers' certificate it makes, used by real
 * nats-servers for clients and for routes, and what a client or a server without the CA's
 * trust meets.
 */

const run = promisify(execFile);
const servers: ChildProcess[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.kill("SIGKILL");
});

async function cli(args: string[], env: NodeJS.ProcessEnv = {}) {
  return run(process.execPath, [BOXCAR_BIN, ...args], { env: { ...process.env, ...env } }).then(
    (r) => ({ code: 0, ...r }),
    (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, stdout: e.stdout, stderr: e.stderr }),
  );
}

/** Starts nats-server with `config` and waits until it is ready. */
async function natsServer(dir: string, name: string, config: string): Promise<ChildProcess> {
  const file = join(dir, `${name}.conf`);
  await writeFile(file, config);
  const child = spawn(findNatsServer(), ["-c", file], { stdio: ["ignore", "ignore", "pipe"] });
  servers.push(child);
  let log = "";
  await new Promise<void>((ready, fail) => {
    child.stderr?.setEncoding("utf8").on("data", (d: string) => {
      log += d;
      if (log.includes("Server is ready")) ready();
    });
    child.on("exit", (code) => fail(new Error(`nats-server ${name} exited (${code}): ${log}`)));
  });
  return child;
}

describe("TLS from boxcar auth init", () => {
  test("a server run from the folder's own config takes clients over TLS only; a client verifies it with the CA, and one that does not trust the CA is refused, told to give --tls-ca", async () => {
    await using dir = await scratch("boxcar-tls-");
    const port = await freePort();
    const auth = join(dir.path, "auth");
    const init = await cli(["auth", "init", auth, "--listen", `127.0.0.1:${port}`, "--json"]);
    expect(init.code, init.stderr).toBe(0);
    expect(JSON.parse(init.stdout).tls.ca).toBe(join(auth, "tls", "ca.pem"));
    // The CA's key stays with the seeds; every file only its owner's.
    for (const file of ["keys/ca.key", "tls/ca.pem", "tls/server.pem", "tls/server-key.pem"]) {
      expect((await stat(join(auth, file))).mode & 0o777, file).toBe(0o600);
    }
    const conf = await readFile(join(auth, "nats-server.conf"), "utf8");
    expect(conf).toContain(`cert_file: ${JSON.stringify(join(auth, "tls", "server.pem"))}`);
    await natsServer(auth, "single", conf); // beside auth.conf, which it includes
    const url = `tls://127.0.0.1:${port}`;
    const dispatcher = spawn(process.execPath, [BOXCAR_BIN, "dispatcher"], {
      env: { ...process.env, BOXCAR_NATS_URL: url, NATS_CREDS: join(auth, "dispatcher.creds"), NATS_CA: join(auth, "tls", "ca.pem") },
      stdio: "ignore",
    });
    servers.push(dispatcher);
    const asAdmin = ["--nats", url, "--creds", join(auth, "admin.creds")];
    await eventually(
      async () => ((await cli(["jobs", ...asAdmin, "--tls-ca", join(auth, "tls", "ca.pem")])).code === 0 ? true : undefined),
      "jobs over TLS",
      20_000,
    );
    // Without the CA (and with nats://: the server asks for TLS all the same) the client refuses the server.
    for (const nats of [url, `nats://127.0.0.1:${port}`]) {
      const refused = await cli(["jobs", "--nats", nats, "--creds", join(auth, "admin.creds")]);
      expect(refused.code).toBe(4);
      expect(refused.stderr).toContain("give --tls-ca FILE");
    }
  }, 60_000);

  test("a server with another system's certificate is refused by clients of this one (no impersonation)", async () => {
    await using dir = await scratch("boxcar-tls-");
    const ours = await AuthDir.init(join(dir.path, "ours"));
    const theirs = await AuthDir.init(join(dir.path, "theirs"));
    const port = await freePort();
    // The impostor has a valid certificate for 127.0.0.1, from its own CA.
    await natsServer(
      dir.path,
      "impostor",
      `listen: "127.0.0.1:${port}"\ntls { cert_file: "${theirs.dir}/tls/server.pem", key_file: "${theirs.dir}/tls/server-key.pem" }\n`,
    );
    const settings = { nats: `tls://127.0.0.1:${port}`, tlsCa: ours.caFile as string };
    await expect(connectNats(resolveConnection({ flags: settings, env: {} }), "tls-test")).rejects.toThrow(/certificate/);
    const trusting = await connectNats(resolveConnection({ flags: { ...settings, tlsCa: theirs.caFile as string }, env: {} }), "tls-test");
    await trusting.close();
  }, 30_000);

  test("three servers route over TLS, each verifying the other against the CA, and place a stream of 3 replicas; a server whose certificate another CA signed cannot join", async () => {
    await using dir = await scratch("boxcar-tls-");
    const auth = await AuthDir.init(join(dir.path, "auth"));
    const rogue = await AuthDir.init(join(dir.path, "rogue"));
    // A meta group formed without one of the three servers ("no suitable peers for placement")
    // has not been seen to take it in later (here, 1 start in 5 under load; `natsCluster` starts
    // again for the same reason): the three are started again, on new ports and stores.
    for (let attempt = 1; ; attempt++) {
      const routePorts = [await freePort(), await freePort(), await freePort(), await freePort()];
      const clientPorts = [await freePort(), await freePort(), await freePort(), await freePort()];
      const monitorPort = await freePort();
      const routes = routePorts
        .slice(0, 3)
        .map((p) => `"nats://localhost:${p}"`)
        .join(", ");
      const config = (i: number, folder: AuthDir, trusts = folder) =>
        [
          `server_name: s${i}`,
          `listen: "127.0.0.1:${clientPorts[i]}"`,
          i === 0 ? `http: "127.0.0.1:${monitorPort}"` : "",
          `tls { cert_file: "${folder.dir}/tls/server.pem", key_file: "${folder.dir}/tls/server-key.pem" }`,
          `jetstream { store_dir: "${join(dir.path, `js${attempt}-${i}`)}", max_file_store: 256MB }`,
          `cluster { name: c, listen: "127.0.0.1:${routePorts[i]}", routes: [${routes}]`,
          `  tls { cert_file: "${folder.dir}/tls/server.pem", key_file: "${folder.dir}/tls/server-key.pem", ca_file: "${trusts.dir}/tls/ca.pem", verify: true } }`,
        ].join("\n");
      for (const i of [0, 1, 2]) await natsServer(dir.path, `s${i}-${attempt}`, config(i, auth));
      const nc = await connectNats(
        resolveConnection({ flags: { nats: `tls://localhost:${clientPorts[0]}`, tlsCa: auth.caFile as string }, env: {} }),
        "tls-test",
      );
      try {
        let refusal = "none yet";
        const placed = await eventually(
          () =>
            jetstreamManager(nc)
              .then((jsm) => jsm.streams.add({ name: "TLS3", subjects: ["tls3.>"], num_replicas: 3 }))
              .then(
                (info) => info,
                (e: Error) => {
                  refusal = e.message;
                  return undefined;
                },
              ),
          () => `a stream of 3 replicas (the last refusal: ${refusal})`,
          20_000,
        ).catch((err: Error) => {
          if (attempt === 3 || !refusal.includes("no suitable peers")) throw err;
          return undefined;
        });
        if (!placed) {
          for (const server of servers.splice(0)) server.kill("SIGKILL");
          continue;
        }
        expect(placed.cluster?.replicas?.length).toBe(2);
        // A fourth server that trusts the cluster's CA but has a certificate another CA signed dials
        // the cluster's routes: the cluster's servers verify it (verify: true) and refuse it.
        // Its ports taken now: taken with the others, one was once another test's by this time.
        for (let tries = 1; ; tries++) {
          routePorts[3] = await freePort();
          clientPorts[3] = await freePort();
          const started = await natsServer(dir.path, `rogue-${attempt}-${tries}`, config(3, rogue, auth)).catch((err: Error) => {
            if (tries === 3 || !err.message.includes("address already in use")) throw err;
            return undefined;
          });
          if (started) break;
        }
        await new Promise((r) => setTimeout(r, 3_000));
        const routez = (await (await fetch(`http://127.0.0.1:${monitorPort}/routez`)).json()) as { routes: { remote_name?: string }[] };
        const peers = new Set(routez.routes.map((r) => r.remote_name));
        expect(peers).toEqual(new Set(["s1", "s2"]));
        return;
      } finally {
        await nc.close();
      }
    }
  }, 120_000);

  test("auth tls issues a new certificate from the same CA with more names; --no-tls makes none; a bad name is refused", async () => {
    await using dir = await scratch("boxcar-tls-");
    const auth = join(dir.path, "auth");
    expect((await cli(["auth", "init", auth])).code).toBe(0);
    const before = new X509Certificate(await readFile(join(auth, "tls", "server.pem")));
    const added = await cli(["auth", "tls", "--dir", auth, "--tls-host", "nats.example.com"]);
    expect(added.code, added.stderr).toBe(0);
    const after = new X509Certificate(await readFile(join(auth, "tls", "server.pem")));
    const ca = new X509Certificate(await readFile(join(auth, "tls", "ca.pem")));
    expect(after.checkHost("nats.example.com")).toBe("nats.example.com");
    expect(before.checkHost("nats.example.com")).toBeUndefined();
    expect(after.checkIssued(ca) && after.verify(ca.publicKey)).toBe(true);
    expect(after.checkHost("nats1")).toBe("nats1"); // the defaults are kept

    const bad = await cli(["auth", "init", join(dir.path, "bad"), "--tls-host", "no spaces"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--tls-host: "no spaces" is neither a host name');

    const plain = join(dir.path, "plain");
    expect((await cli(["auth", "init", plain, "--no-tls"])).code).toBe(0);
    expect(await readFile(join(plain, "nats-server.conf"), "utf8")).not.toMatch(/tls \{/);
    const none = await cli(["auth", "tls", "--dir", plain]);
    expect(none.code).not.toBe(0);
    expect(none.stderr).toContain("made without TLS");
  }, 30_000);
});
