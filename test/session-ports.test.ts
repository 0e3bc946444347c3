/**
 * A session's ports (docs/sessions.md#ports), against a real nats-server with authentication: an
 * HTTP server started in a session's background is reached through the worker, over NATS, from a
 * local port (the SDK's forwardSessionPort, `boxcar session port`) or one connection at a time
 * (connectToSession), in host and Docker sessions. Bytes come through exactly both ways; a port
 * nobody listens on, one out of range, a viewer and another user are refused; the tunnels end
 * with the session; and a Docker session's tunnel reaches only its container's own loopback.
 */

import { createHash } from "node:crypto";
import { createServer, type Server } from "node:net";
import type { Duplex } from "node:stream";
import { dockerReady, eventually } from "@boxcar/testing";
import { createDockerSandboxProvider } from "@boxcar/worker";
import { type NatsConnection, errors as natsErrors } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { spawnBoxcar } from "./helpers/cli.js";
import { type Principal, type SecuredSystem, securedSystem } from "./helpers/secured.js";

const ready = await dockerReady();

/** The bytes the session's server sends for `/big`: the same formula here and there. */
const BIG = 8 * 1024 * 1024;
function bigBody(): Buffer {
  const big = Buffer.alloc(BIG);
  for (let i = 0; i < big.length; i++) big[i] = (i * 7919 + (i >>> 13)) & 255;
  return big;
}
const sha256 = (data: Uint8Array) => createHash("sha256").update(data).digest("hex");

/**
 * A Node.js program for the session: an HTTP server on `http` (`/big`: 8 MiB; a POST: the size and
 * SHA-256 of its body; else `served <url>`) and, on `tcp`, a server that speaks first and echoes.
 */
function servers(http: number, tcp: number): string {
  return `
const crypto = require("node:crypto");
const big = Buffer.alloc(${BIG});
for (let i = 0; i < big.length; i++) big[i] = (i * 7919 + (i >>> 13)) & 255;
require("node:http").createServer((q, s) => {
  if (q.url === "/big") { s.setHeader("content-length", big.length); s.end(big); return; }
  if (q.method === "POST") {
    const h = crypto.createHash("sha256"); let n = 0;
    q.on("data", (c) => { n += c.length; h.update(c); });
    q.on("end", () => s.end(n + " " + h.digest("hex")));
    return;
  }
  s.end("served " + q.url);
}).listen(${http}, "127.0.0.1");
require("node:net").createServer((c) => { c.write("hello from the session\\n"); c.pipe(c); }).listen(${tcp}, "127.0.0.1", () => console.log("listening"));
`;
}

/** Reads a stream until `want` bytes came, or it ended (leaving it open). */
function readUntil(stream: Duplex, want: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    if (stream.destroyed) {
      reject(stream.errored ?? new Error("the stream is closed"));
      return;
    }
    const chunks: Buffer[] = [];
    let got = 0;
    const done = () => {
      stream.off("data", onData);
      stream.off("end", done);
      stream.off("error", reject);
      stream.pause();
      resolve(Buffer.concat(chunks));
    };
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      got += chunk.length;
      if (got >= want) done();
    };
    stream.on("data", onData);
    stream.once("end", done);
    stream.once("error", reject);
    stream.resume();
  });
}

/** Whether a stream ends with an error, and which. */
function endOf(stream: Duplex): Promise<Error | "ended"> {
  return new Promise((resolve) => {
    stream.once("error", (err) => resolve(err));
    stream.once("close", () => resolve("ended"));
  });
}

/** A free TCP port of this machine (listened on and let go). */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as { port: number };
  await new Promise((r) => server.close(r));
  return port;
}

/** True when `err` is NATS refusing a publish or subscription. */
function isDenied(err: unknown): boolean {
  for (let e = err; e; e = (e as Error).cause) {
    if (e instanceof natsErrors.PermissionViolationError) return true;
    if (e instanceof Error && /permissions violation/i.test(e.message)) return true;
  }
  return false;
}

async function expectSubscribeDenied(nc: NatsConnection, subject: string): Promise<void> {
  const sub = nc.subscribe(subject);
  const ended = (async () => {
    for await (const _ of sub) return "delivered";
    return "closed";
  })().catch((err: unknown) => (isDenied(err) ? "denied" : `failed: ${String(err)}`));
  await nc.flush();
  expect(await Promise.race([ended, new Promise((r) => setTimeout(() => r("still open"), 3_000))]), subject).toBe("denied");
}

/**
 * What every kind of session must do: `owner` opens it of `agent`, its servers listen on `http`
 * and `tcp`; `others` are refused.
 */
async function checkPorts(
  owner: Principal,
  others: { stranger: Principal; viewer: Principal },
  agent: string,
  ports: { http: number; tcp: number; idle: number },
): Promise<void> {
  const session = await owner.client.openSession({ agent });
  const node = agent === "shell" ? process.execPath : "node";
  await owner.client.startInSession({ id: session.id, argv: [node, "-e", servers(ports.http, ports.tcp)] });
  await using forward = await owner.client.forwardSessionPort(session.id, ports.http);
  expect(forward.host).toBe("127.0.0.1");
  const url = `http://127.0.0.1:${forward.port}`;
  // Through the local port: its first answer once the server listens.
  const first = await eventually(
    async () =>
      (await fetch(`${url}/hello`)
        .then((r) => (r.ok ? r.text() : undefined))
        .catch(() => undefined)) ?? undefined,
    "the session's server to answer through the tunnel",
  );
  expect(first).toBe("served /hello");
  // 8 MiB out of the session and 5 MiB into it, byte for byte; several at once.
  const big = bigBody();
  const upload = Buffer.from(
    bigBody()
      .subarray(0, 5 * 1024 * 1024)
      .reverse(),
  );
  const [down, up, again] = await Promise.all([
    fetch(`${url}/big`).then(async (r) => Buffer.from(await r.arrayBuffer())),
    fetch(`${url}/upload`, { method: "POST", body: upload }).then((r) => r.text()),
    fetch(`${url}/big`).then(async (r) => Buffer.from(await r.arrayBuffer())),
  ]);
  expect(down.length).toBe(BIG);
  expect(sha256(down)).toBe(sha256(big));
  expect(sha256(again)).toBe(sha256(big));
  expect(up).toBe(`${upload.length} ${sha256(upload)}`);

  // A reader that stops now and then holds the server back, and loses nothing (the flow control
  // through the worker, and a Docker session's helper, waits for it).
  const raw = await owner.client.connectToSession(session.id, ports.http);
  raw.on("error", () => {}); // read to its end below, then let go
  raw.write("GET /big HTTP/1.0\r\n\r\n");
  const slow: Buffer[] = [];
  let read = 0;
  for await (const chunk of raw) {
    slow.push(chunk as Buffer);
    read += (chunk as Buffer).length;
    if (slow.length % 16 === 0) await new Promise((r) => setTimeout(r, 20));
  }
  const response = Buffer.concat(slow);
  const bodyAt = response.indexOf("\r\n\r\n") + 4;
  expect(response.subarray(0, 12).toString()).toBe("HTTP/1.1 200");
  expect(read - bodyAt).toBe(BIG);
  expect(sha256(response.subarray(bodyAt))).toBe(sha256(big));

  // One connection as a stream, to a server that speaks first: its first bytes are not lost, and it echoes.
  const echo = await owner.client.connectToSession(session.id, ports.tcp);
  expect((await readUntil(echo, 23)).toString()).toBe("hello from the session\n");
  echo.write("ping\n");
  expect((await readUntil(echo, 5)).toString()).toBe("ping\n");

  // Refusals: nobody listens there; a port out of range; another user; a viewer.
  await expect(owner.client.connectToSession(session.id, ports.idle)).rejects.toMatchObject({
    code: "unavailable",
    message: expect.stringMatching(new RegExp(`nothing listens on port ${ports.idle} in the session`)),
  });
  for (const bad of [0, 65_536, 1.5]) {
    await expect(owner.client.connectToSession(session.id, bad)).rejects.toMatchObject({
      code: "invalid",
      message: expect.stringMatching(/a port is a whole number from 1 to 65535/),
    });
  }
  await expect(others.stranger.client.connectToSession(session.id, ports.http)).rejects.toMatchObject({ code: "not_found" });
  await expect(others.viewer.client.connectToSession(session.id, ports.http)).rejects.toMatchObject({ code: "forbidden" });

  // Closing the session ends its tunnels, saying why; the local port's new connections are refused.
  const ended = endOf(echo);
  await owner.client.closeSession(session.id);
  const why = await ended;
  expect(why).toBeInstanceOf(Error);
  expect((why as Error & { code?: string }).code).toBe("tunnel_reset");
  expect((why as Error).message).toMatch(new RegExp(`session ${session.id} closed`));
  await expect(fetch(`${url}/hello`)).rejects.toThrow();
}

describe("ports of a host session", () => {
  let system: SecuredSystem;
  let admin: Principal;
  let bob: Principal;
  let viewer: Principal;

  beforeAll(async () => {
    system = await securedSystem();
    admin = await system.as("admin", "admin");
    bob = await system.as("bob", "submitter");
    viewer = await system.as("viewer", "viewer");
    await admin.client.applyAgent({ name: "shell", command: ["true"], trusted: true, sessions: true, runtime: { sandbox: "host" } });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("a server in the session is reached through a local port and a stream, byte for byte; refusals; closing ends them", async () => {
    await checkPorts(admin, { stranger: bob, viewer }, "shell", { http: await freePort(), tcp: await freePort(), idle: await freePort() });
  }, 120_000);

  test("bytes through a tunnel are use: the session outlives its idle timeout while they go, and closes once they stop", async () => {
    const session = await admin.client.openSession({ agent: "shell", idleTimeout: "2s" });
    const tcp = await freePort();
    // Out of the command's process group (a session of its own, made before the command ends), so
    // that no process in the background keeps the session open.
    const script = servers(await freePort(), tcp);
    const detach = `require("node:child_process").spawn(process.execPath, ["-e", ${JSON.stringify(script)}], { detached: true, stdio: "ignore" }).unref()`;
    const ran = await admin.client.execInSession({ id: session.id, argv: [process.execPath, "-e", detach] });
    expect(ran.exitCode).toBe(0);
    expect(await admin.client.sessionProcesses(session.id)).toEqual([]);
    const echo = await eventually(
      () => admin.client.connectToSession(session.id, tcp).catch(() => undefined),
      "the session's server to listen",
    );
    await readUntil(echo, 23);
    // Twice its idle timeout, a line every half second: it stays open.
    for (let i = 0; i < 8; i++) {
      echo.write(`line ${i}\n`);
      expect((await readUntil(echo, 7)).toString()).toBe(`line ${i}\n`);
      await new Promise((r) => setTimeout(r, 500));
    }
    expect((await admin.client.getSession(session.id)).state).toBe("open");
    // Nothing goes through the open tunnel any more: the session closes as idle, and the tunnel with it.
    const ended = endOf(echo);
    expect(await ended).toMatchObject({ code: "tunnel_reset", message: expect.stringMatching(/\(idle\)/) });
    // The tunnels are ended as the close begins; the record says closed once it is done.
    const closed = await eventually(async () => {
      const now = await admin.client.getSession(session.id);
      return now.state === "closed" ? now : undefined;
    }, "the session's record to say closed");
    expect(closed).toMatchObject({ state: "closed", reason: "idle" });
  }, 60_000);

  test("at most 32 connections to a session's ports at once", async () => {
    const session = await admin.client.openSession({ agent: "shell" });
    const tcp = await freePort();
    await admin.client.startInSession({ id: session.id, argv: [process.execPath, "-e", servers(await freePort(), tcp)] });
    const first = await eventually(
      () => admin.client.connectToSession(session.id, tcp).catch(() => undefined),
      "the session's server to listen",
    );
    const open = [first];
    for (let i = 1; i < 32; i++) open.push(await admin.client.connectToSession(session.id, tcp));
    // Each ends with the session, saying so.
    const ends = open.map(endOf);
    await expect(admin.client.connectToSession(session.id, tcp)).rejects.toMatchObject({
      code: "conflict",
      message: expect.stringMatching(/32 connections to its ports open/),
    });
    // One closed, another may open.
    const closing = endOf(open[0] as Duplex);
    open[0]?.resume();
    open[0]?.end();
    await closing;
    const another = await eventually(
      () => admin.client.connectToSession(session.id, tcp).catch(() => undefined),
      "room for another connection",
    );
    expect((await readUntil(another, 23)).toString()).toBe("hello from the session\n");
    const lastEnd = endOf(another);
    await admin.client.closeSession(session.id);
    for (const end of [...ends.slice(1), lastEnd]) expect(await end).toMatchObject({ code: "tunnel_reset" });
  }, 60_000);
});

describe.skipIf(!ready)("ports of a Docker session", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let viewer: Principal;

  beforeAll(async () => {
    system = await securedSystem({ providers: ({ prefix, systemId }) => [createDockerSandboxProvider({ prefix, system: systemId })] });
    alice = await system.as("alice", "submitter");
    bob = await system.as("bob", "submitter");
    viewer = await system.as("viewer", "viewer");
    const admin = await system.as("admin", "admin");
    await admin.client.applyAgent({ name: "box", command: ["true"], sessions: true, runtime: { sandbox: "docker", timeout: "1m" } });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("a server in the session (no network) is reached through a local port and a stream, byte for byte; refusals; closing ends them", async () => {
    await checkPorts(alice, { stranger: bob, viewer }, "box", { http: 8080, tcp: 7070, idle: 9999 });
  }, 120_000);

  test("attack: a tunnel reaches only the container's own loopback, not the worker's; another user cannot use one's tunnel subjects", async () => {
    // A server on this machine's (the worker's) loopback: the session's tunnel must not reach it.
    let reached = 0;
    const onHost: Server = createServer((c) => {
      reached += 1;
      c.end("the worker's machine\n");
    });
    await new Promise<void>((r) => onHost.listen(0, "127.0.0.1", r));
    const hostPort = (onHost.address() as { port: number }).port;
    try {
      const session = await alice.client.openSession({ agent: "box" });
      await expect(alice.client.connectToSession(session.id, hostPort)).rejects.toMatchObject({ code: "unavailable" });
      expect(reached).toBe(0);
      // A port field with a host in it is no port; a request with a host is refused whole.
      await expect(alice.client.connectToSession(session.id, "127.0.0.1:22" as unknown as number)).rejects.toMatchObject({
        code: "invalid",
      });
      // Tunnel subjects are their user's: another submitter and a viewer may not listen to alice's, nor send into them.
      const subjects = alice.names.subjects;
      await expectSubscribeDenied(bob.nc, subjects.ownerTunnels("alice"));
      await expectSubscribeDenied(viewer.nc, subjects.tunnelsAll("out"));
      let refused: unknown;
      await bob.nc.request(subjects.tunnel("alice", "abcdefgh12345678", "in"), "x", { timeout: 2_000 }).catch((err: unknown) => {
        refused = err;
      });
      expect(isDenied(refused), String(refused)).toBe(true);
      await alice.client.closeSession(session.id);
    } finally {
      onHost.close();
    }
  }, 60_000);

  test("through the CLI: session port prints its local port, relays to the session's server, and stops when the session closes", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await alice.client.startInSession({ id: session.id, argv: ["node", "-e", servers(8080, 7070)] });
    const cli = spawnBoxcar(system.url, system.prefix, ["session", "port", session.id, "8080"], { NATS_CREDS: alice.creds });
    try {
      let out = "";
      let err = "";
      cli.stdout?.on("data", (c: Buffer) => {
        out += c.toString();
      });
      cli.stderr?.on("data", (c: Buffer) => {
        err += c.toString();
      });
      const local = await eventually(async () => /^127\.0\.0\.1:(\d+)\n/.exec(out)?.[1], "the CLI to print its local port");
      const body = await eventually(
        async () =>
          (await fetch(`http://127.0.0.1:${local}/cli`)
            .then((r) => (r.ok ? r.text() : undefined))
            .catch(() => undefined)) ?? undefined,
        "the session's server to answer through the CLI's port",
      );
      expect(body).toBe("served /cli");
      const exited = new Promise<number | null>((r) => cli.once("exit", r));
      await alice.client.closeSession(session.id);
      expect(await exited).toBe(3);
      expect(err).toMatch(new RegExp(`session ${session.id} closed`));
    } finally {
      cli.kill("SIGKILL");
    }
    // A port out of range is a usage error, before anything is asked.
    const bad = spawnBoxcar(system.url, system.prefix, ["session", "port", session.id, "70000"], { NATS_CREDS: alice.creds });
    let said = "";
    bad.stderr?.on("data", (c: Buffer) => {
      said += c.toString();
    });
    expect(await new Promise((r) => bad.once("exit", r))).toBe(2);
    expect(said).toMatch(/a port is a whole number from 1 to 65535/);
  }, 90_000);
});
