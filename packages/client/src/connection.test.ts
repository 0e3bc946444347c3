import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, test } from "vitest";
import { identityOf, resolveConnection } from "./connection.js";

test("each setting comes from the flag, else the environment, else the nats context, else the config file", () => {
  const home = mkdtempSync(join(tmpdir(), "boxcar-ctx-"));
  const ctxDir = join(home, "nats", "context");
  mkdirSync(ctxDir, { recursive: true });
  writeFileSync(join(ctxDir, "c.json"), JSON.stringify({ url: "nats://ctx:4222", user: "ctx-user", password: "ctx-pw", token: "" }));
  const env = { XDG_CONFIG_HOME: home, NATS_CONTEXT: "c", NATS_USER: "env-user" };
  const file = { nats: "nats://file:4222", user: "file-user", tlsCa: "/file/ca.pem" };
  const r = resolveConnection({ flags: { password: "flag-pw" }, env, file });
  expect(r.servers).toEqual(["nats://ctx:4222"]);
  expect(r.settings.user).toBe("env-user");
  expect(r.settings.password).toBe("flag-pw");
  expect(r.settings.tlsCa).toBe("/file/ca.pem");
  expect(r.settings.token).toBeUndefined(); // an empty context field is unset, as in the nats CLI
  expect(resolveConnection({ env: {} }).servers).toEqual(["nats://127.0.0.1:4222"]);
  expect(resolveConnection({ env: { NATS_URL: "nats://n:1", BOXCAR_NATS_URL: "nats://b:2,nats://c:3" } }).servers).toEqual([
    "nats://b:2",
    "nats://c:3",
  ]);
});

test("credentials in a URL become settings and leave the URL; a flag still wins", () => {
  const r = resolveConnection({ flags: { nats: "nats://ann:p%40ss@h:4222,nats://h2:4222" }, env: {} });
  expect(r.servers).toEqual(["nats://h:4222", "nats://h2:4222"]);
  expect([r.settings.user, r.settings.password]).toEqual(["ann", "p@ss"]);
  expect(resolveConnection({ flags: { nats: "nats://tok@h:4222" }, env: {} }).settings.token).toBe("tok");
  expect(resolveConnection({ flags: { nats: "nats://ann:x@h:4222", password: "y" }, env: {} }).settings.password).toBe("y");
});

test("a connection asks as BOXCAR_IDENTITY, else its credential's user and role tag, else as the local admin", () => {
  const payload = Buffer.from(JSON.stringify({ name: "alice", nats: { tags: ["boxcar-role:submitter"] } })).toString("base64url");
  const creds = `-----BEGIN NATS USER JWT-----\nxx.${payload}.yy\n------END NATS USER JWT------\n`;
  expect(identityOf(creds, {})).toEqual({ role: "submitter", user: "alice" });
  expect(identityOf(undefined, {})).toEqual({ role: "admin", user: "local" });
  expect(identityOf(creds, { BOXCAR_IDENTITY: "viewer:v1" })).toEqual({ role: "viewer", user: "v1" });
  expect(() => identityOf(undefined, { BOXCAR_IDENTITY: "root:x" })).toThrow(/BOXCAR_IDENTITY/);
  const untagged = Buffer.from(JSON.stringify({ name: "bob" })).toString("base64url");
  expect(() => identityOf(`-----BEGIN NATS USER JWT-----\nx.${untagged}.y\n------END NATS USER JWT------`, {})).toThrow(/boxcar-role tag/);
});

test("a missing credential file is an error naming the flag and the file", () => {
  expect(() => resolveConnection({ flags: { creds: "/no/such.creds" }, env: {} })).toThrow(
    "--creds / NATS_CREDS: cannot read /no/such.creds: ENOENT",
  );
});

test("a file given as --creds that holds no user JWT is named, with the flag for a bare seed", () => {
  const dir = mkdtempSync(join(tmpdir(), "boxcar-creds-"));
  const seedOnly = join(dir, "account.nk");
  writeFileSync(seedOnly, "SAAB2C3D\n");
  expect(() => resolveConnection({ flags: { creds: seedOnly }, env: {} })).toThrow(`${seedOnly} holds no user JWT`);
  expect(() => resolveConnection({ flags: { creds: seedOnly }, env: {} })).toThrow("use --nkey");
});
