import { execFileSync } from "node:child_process";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { startNatsServer } from "@boxcar/fabric";
import { eventually, type Scratch, scratch, uniquePrefix } from "@boxcar/testing";
import { createUser } from "@nats-io/nkeys";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";

/**
 * Every command connects as the `nats` CLI does. A command that reaches a server with no Boxcar
 * system on it fails with "no dispatcher answers": proof that it connected, logged in and sent
 * its request, where a refused login fails with "Authorization Violation".
 */
const CONNECTED = /no dispatcher answers on/;
const REFUSED = /Authorization Violation|authorization violation/i;

let dir: Scratch;
beforeAll(async () => {
  dir = await scratch("boxcar-conn-");
});
afterAll(async () => {
  await dir?.[Symbol.asyncDispose]();
});

describe("user and password, token", () => {
  it("--user/--password, NATS_USER/NATS_PASSWORD and a URL with user:pass@ log in; a wrong password is refused and never printed", async () => {
    await using server = await startNatsServer({ extraConfig: 'authorization { user: "ann", password: "s3cret-pw" }' });
    const prefix = uniquePrefix();
    expect((await boxcar(server.url, prefix, ["jobs", "--user", "ann", "--password", "s3cret-pw"])).stderr).toMatch(CONNECTED);
    expect((await boxcar(server.url, prefix, ["jobs"], { NATS_USER: "ann", NATS_PASSWORD: "s3cret-pw" })).stderr).toMatch(CONNECTED);
    const withAuth = server.url.replace("nats://", "nats://ann:s3cret-pw@");
    expect((await boxcar(withAuth, prefix, ["jobs"])).stderr).toMatch(CONNECTED);
    const wrong = await boxcar(server.url.replace("nats://", "nats://ann:wr0ng-pw@"), prefix, ["jobs"]);
    expect(wrong.code).toBe(4);
    expect(wrong.stderr).toMatch(REFUSED);
    expect(wrong.stderr).toContain("cannot connect to NATS at nats://127.0.0.1:");
    expect(wrong.stderr).not.toContain("wr0ng-pw");
    const none = await boxcar(server.url, prefix, ["jobs"]);
    expect(none.code).toBe(4);
    expect(none.stderr).toMatch(REFUSED);
  }, 60_000);

  it("--token and NATS_TOKEN log in", async () => {
    await using server = await startNatsServer({ extraConfig: 'authorization { token: "t0ken-value" }' });
    const prefix = uniquePrefix();
    expect((await boxcar(server.url, prefix, ["jobs", "--token", "t0ken-value"])).stderr).toMatch(CONNECTED);
    expect((await boxcar(server.url, prefix, ["jobs"], { NATS_TOKEN: "t0ken-value" })).stderr).toMatch(CONNECTED);
    const wrong = await boxcar(server.url, prefix, ["jobs", "--token", "bad-t0ken"]);
    expect(wrong.stderr).toMatch(REFUSED);
    expect(wrong.stderr).not.toContain("bad-t0ken");
  }, 30_000);
});

describe("nkey and a nats CLI context", () => {
  it("--nkey FILE logs in with a seed; --context NAME and NATS_CONTEXT read the nats CLI's context file", async () => {
    const user = createUser();
    const seedFile = join(dir.path, "user.nk");
    await writeFile(seedFile, new TextDecoder().decode(user.getSeed()), { mode: 0o600 });
    await using server = await startNatsServer({ extraConfig: `authorization { users: [ { nkey: ${user.getPublicKey()} } ] }` });
    const prefix = uniquePrefix();
    expect((await boxcar(server.url, prefix, ["jobs", "--nkey", seedFile])).stderr).toMatch(CONNECTED);
    expect((await boxcar(server.url, prefix, ["jobs"], { NATS_NKEY: seedFile })).stderr).toMatch(CONNECTED);

    const config = join(dir.path, "xdg");
    await mkdir(join(config, "nats", "context"), { recursive: true });
    await writeFile(join(config, "nats", "context", "lab.json"), JSON.stringify({ description: "test", url: server.url, nkey: seedFile }));
    const env = { XDG_CONFIG_HOME: config, BOXCAR_NATS_URL: "" };
    const viaFlag = await boxcar("", prefix, ["jobs", "--context", "lab"], env);
    expect(viaFlag.stderr).toMatch(CONNECTED);
    expect((await boxcar("", prefix, ["jobs"], { ...env, NATS_CONTEXT: "lab" })).stderr).toMatch(CONNECTED);
    const missing = await boxcar("", prefix, ["jobs", "--context", "nope"], env);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("nats context nope: cannot read");
  }, 30_000);

  it("the worker config file takes the same keys", async () => {
    await using server = await startNatsServer({ extraConfig: 'authorization { user: "wk", password: "w0rker-pw" }' });
    const file = join(dir.path, "worker.yaml");
    await writeFile(file, `nats: ${server.url}\nuser: wk\npassword: w0rker-pw\nsandbox:\n  allowed: [host]\n`);
    const worker = spawnBoxcar("", uniquePrefix(), ["worker", "--config", file], { BOXCAR_NATS_URL: "" });
    await eventually(async () => (worker.output().includes("worker started") ? true : undefined), "the worker to start");
    expect(worker.output()).not.toContain("w0rker-pw");
    worker.kill("SIGTERM");
    await exited(worker);
  }, 30_000);
});

describe("TLS", () => {
  let tls: Record<"ca" | "serverCert" | "serverKey" | "clientCert" | "clientKey", string>;
  beforeAll(() => {
    const at = (f: string) => join(dir.path, f);
    const ssl = (...args: string[]) => execFileSync("openssl", args, { stdio: "pipe" });
    ssl(
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-days",
      "2",
      "-subj",
      "/CN=test-ca",
      "-keyout",
      at("ca.key"),
      "-out",
      at("ca.pem"),
    );
    for (const [name, cn, ext] of [
      ["server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
      ["client", "boxcar-client", "extendedKeyUsage=clientAuth"],
    ] as const) {
      ssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        `/CN=${cn}`,
        "-keyout",
        at(`${name}.key`),
        "-out",
        at(`${name}.csr`),
      );
      const extFile = at(`${name}.ext`);
      execFileSync("sh", ["-c", `printf '%s\\n' '${ext}' > ${extFile}`]);
      ssl(
        "x509",
        "-req",
        "-in",
        at(`${name}.csr`),
        "-CA",
        at("ca.pem"),
        "-CAkey",
        at("ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        extFile,
        "-out",
        at(`${name}.pem`),
      );
    }
    tls = {
      ca: at("ca.pem"),
      serverCert: at("server.pem"),
      serverKey: at("server.key"),
      clientCert: at("client.pem"),
      clientKey: at("client.key"),
    };
  });

  it("mutual TLS: without a client certificate the server refuses; with --tls-cert/--tls-key/--tls-ca (or NATS_CERT/NATS_KEY/NATS_CA) it works", async () => {
    await using server = await startNatsServer({
      extraConfig: `tls { cert_file: "${tls.serverCert}", key_file: "${tls.serverKey}", ca_file: "${tls.ca}", verify: true }`,
    });
    const prefix = uniquePrefix();
    const noCert = await boxcar(server.url, prefix, ["jobs", "--tls-ca", tls.ca]);
    expect(noCert.code).toBe(4);
    expect(noCert.stderr).toContain("if the server wants a client certificate, give --tls-cert and --tls-key");
    const flags = ["--tls-ca", tls.ca, "--tls-cert", tls.clientCert, "--tls-key", tls.clientKey];
    expect((await boxcar(server.url, prefix, ["jobs", ...flags])).stderr).toMatch(CONNECTED);
    expect(
      (await boxcar(server.url, prefix, ["jobs"], { NATS_CA: tls.ca, NATS_CERT: tls.clientCert, NATS_KEY: tls.clientKey })).stderr,
    ).toMatch(CONNECTED);
    const half = await boxcar(server.url, prefix, ["jobs", "--tls-cert", tls.clientCert]);
    expect(half.code).toBe(2);
    expect(half.stderr).toContain("--tls-cert and --tls-key go together");
  }, 30_000);

  it("--tls-first talks TLS before the NATS protocol, for servers with handshake_first", async () => {
    await using server = await startNatsServer({
      extraConfig: `tls { cert_file: "${tls.serverCert}", key_file: "${tls.serverKey}", handshake_first: true }`,
    });
    const prefix = uniquePrefix();
    expect((await boxcar(server.url, prefix, ["jobs", "--tls-ca", tls.ca, "--tls-first"])).stderr).toMatch(CONNECTED);
  }, 30_000);
});
