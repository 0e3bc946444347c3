/**
 * The dashboard on a server with authentication, attacked: a login link works once; the
 * credential a browser holds is short-lived and only its principal's (a viewer cannot cancel,
 * a submitter only its own jobs); a page from another origin cannot use the WebSocket listener;
 * a request under a foreign Host (DNS rebinding) or Origin gets no session; a revoked user gets no
 * new credential; `boxcar ui` refuses to hand a browser an admin credential.
 */

import { writeFile } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { connectNats, createClient, resolveConnection } from "@boxcar/client";
import { freePort } from "@boxcar/fabric";
import { eventually, scratch, uniquePrefix } from "@boxcar/testing";
import { startUiServer, type UiServer } from "@boxcar/ui";
import { type Browser, type BrowserContext, chromium } from "playwright-core";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { browserPath } from "./helpers/browser.js";
import { boxcar } from "./helpers/cli.js";
import { type Principal, type SecuredSystem, securedSystem } from "./helpers/secured.js";

const chromiumPath = browserPath();

/** POSTs to `/session` of `base` with raw headers (Host included), as any client could. */
function postSession(
  base: string,
  headers: Record<string, string>,
): Promise<{ status: number; body: Record<string, unknown>; cookie?: string; setCookie?: string }> {
  const url = new URL(`${base}/session`);
  return new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, path: "/session", method: "POST", headers }, (res) => {
      let text = "";
      res.setEncoding("utf8").on("data", (d: string) => (text += d));
      res.on("end", () =>
        resolve({
          status: res.statusCode ?? 0,
          body: JSON.parse(text || "{}") as Record<string, unknown>,
          ...(res.headers["set-cookie"]?.[0]
            ? { cookie: res.headers["set-cookie"][0].split(";")[0] as string, setCookie: res.headers["set-cookie"][0] }
            : {}),
        }),
      );
    });
    req.on("error", reject);
    req.end();
  });
}

/** The claims of the JWT in a credentials file's text. */
function claimsOf(creds: string): { name: string; iat: number; exp: number; nats: { tags: string[] } } {
  const jwt = /-----BEGIN NATS USER JWT-----\s+(\S+)/.exec(creds)?.[1] ?? "";
  return JSON.parse(Buffer.from(jwt.split(".")[1] ?? "", "base64url").toString("utf8"));
}

describe.skipIf(!chromiumPath)("the dashboard with authentication, attacked", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let browser: Browser;
  let asAlice: UiServer;
  let asViewer: UiServer;
  let viewerUrl: string;
  const logins = { alice: [] as string[], viewer: [] as string[] };
  let evil: Server;
  let wsPort: number;

  beforeAll(async () => {
    // The listener's allowed origins must be known before the server starts: pick the ports first.
    const [alicePort, viewerPort] = [await freePort(), await freePort()];
    wsPort = await freePort();
    const prefix = uniquePrefix();
    system = await securedSystem({
      prefix,
      server: {
        websocket: {
          host: "127.0.0.1",
          port: wsPort,
          // nats-server 2.10 keeps one allowed origin per host name (the last): the second
          // dashboard is reached as localhost.
          allowedOrigins: [`http://127.0.0.1:${alicePort}`, `http://localhost:${viewerPort}`],
        },
      },
    });
    alice = await system.as("alice", "submitter");
    bob = await system.as("bob", "submitter");
    const natsWs = `ws://127.0.0.1:${wsPort}`;
    asAlice = await startUiServer({
      host: "127.0.0.1",
      port: alicePort,
      natsWs,
      prefix,
      principal: { authDir: system.auth.dir, role: "submitter", user: "alice" },
      onLoginUrl: (url) => logins.alice.push(url),
    });
    asViewer = await startUiServer({
      host: "127.0.0.1",
      port: viewerPort,
      natsWs,
      prefix,
      principal: { authDir: system.auth.dir, role: "viewer", user: "viewer" },
      onLoginUrl: (url) => logins.viewer.push(url.replace("127.0.0.1", "localhost")),
    });
    const admin = await system.as("admin", "admin");
    await admin.client.applyAgent({
      name: "sleeper",
      command: ["sh", "-c", "echo started; sleep 60"],
      trusted: true,
      runtime: { sandbox: "host", timeout: "2m" },
    });
    viewerUrl = asViewer.url.replace("127.0.0.1", "localhost");
    // A page on another origin (any web site a local browser opens).
    evil = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "text/html" });
      res.end(`<!doctype html><title>evil</title><script>
        const ws = new WebSocket("ws://127.0.0.1:${wsPort}");
        ws.binaryType = "arraybuffer";
        ws.onmessage = (e) => { document.title = "got " + new TextDecoder().decode(e.data).slice(0, 4); };
        ws.onclose = () => { document.title += " closed"; };
      </script>`);
    });
    await new Promise<void>((r) => evil.listen(0, "127.0.0.1", r));
    browser = await chromium.launch({ executablePath: chromiumPath as string });
  }, 60_000);

  afterAll(async () => {
    await browser?.close();
    await asAlice?.close();
    await asViewer?.close();
    evil?.close();
    await system?.[Symbol.asyncDispose]();
  });

  async function logIn(url: string): Promise<BrowserContext> {
    const context = await browser.newContext();
    const page = await context.newPage();
    await page.goto(url);
    await page.locator("[data-who], p.banner:not([hidden])").first().waitFor();
    return context;
  }

  test("a login link works once, leaves the address bar, and gives a 10-minute credential of its principal only", async () => {
    const link = logins.alice[0] as string;
    const context = await logIn(link);
    const page = context.pages()[0];
    expect(await page?.locator("[data-who]").textContent()).toBe("submitter alice");
    expect(page?.url()).not.toContain("t=");
    // The same link again, in another browser: refused.
    const again = await logIn(link);
    expect(await again.pages()[0]?.locator(".banner").textContent()).toContain("used or has expired");
    await again.close();
    // A new link was printed for the next browser.
    expect(logins.alice.length).toBeGreaterThan(1);
    // The session cookie renews the credential: short-lived, alice's, a submitter's.
    // Named for its dashboard's port: browsers share cookies between the ports of one host.
    const cookie = (await context.cookies()).find((c) => c.name === `boxcar_ui_${new URL(asAlice.url).port}`);
    expect(cookie).toMatchObject({ httpOnly: true, sameSite: "Strict", path: "/session" });
    const renewed = await postSession(asAlice.url, { cookie: `${cookie?.name}=${cookie?.value}`, origin: asAlice.url });
    expect(renewed.status).toBe(200);
    const jwt = claimsOf(String(renewed.body.creds));
    expect(jwt.name).toBe("alice");
    expect(jwt.nats.tags).toContain("boxcar-role:submitter");
    expect(jwt.exp - jwt.iat).toBe(600);
    await context.close();
  });

  test("a submitter's page cancels its own running job, and cannot open another user's", async () => {
    const mine = (await alice.client.submit({ agent: "sleeper", input: null })).job;
    const theirs = (await bob.client.submit({ agent: "sleeper", input: null })).job;
    const context = await logIn(logins.alice.at(-1) as string);
    const page = context.pages()[0];
    if (!page) throw new Error("no page");
    await page.locator(`tr[data-job="${mine.id}"]`).waitFor();
    expect(await page.locator(`tr[data-job="${theirs.id}"]`).count()).toBe(0);
    await page.goto(`${asAlice.url}/#/job/${mine.id}`);
    await page.locator('h1 [data-state="running"]').waitFor({ timeout: 20_000 });
    await page.locator('[data-action="cancel"]').click();
    await page.locator('h1 [data-state="cancelled"]').waitFor({ timeout: 20_000 });
    expect((await alice.client.getJob(mine.id)).state).toBe("cancelled");
    await page.goto(`${asAlice.url}/#/job/${theirs.id}`);
    await page.locator("main .error").waitFor();
    expect(await page.locator("main .error").textContent()).toMatch(/forbidden|not_found/);
    expect((await bob.client.getJob(theirs.id)).state).not.toBe("cancelled");
    await bob.client.cancelJob(theirs.id);
    await context.close();
  }, 60_000);

  test("an approval on a run's page: its approver's page decides it (a run of another user's too), its owner's and a viewer's pages show no buttons", async () => {
    const steps = (approvers: string[]) => [
      { name: "sign-off", approval: { timeout: "10m", approvers } },
      { name: "after", agent: "sleeper", needs: ["sign-off"] },
    ];
    const forBob = (await alice.client.startRun({ workflow: { name: "for-bob", steps: steps(["bob"]) } })).run;
    const forAlice = (await alice.client.startRun({ workflow: { name: "for-alice", steps: steps(["alice"]) } })).run;
    const context = await logIn(logins.alice.at(-1) as string);
    const page = context.pages()[0];
    if (!page) throw new Error("no page");
    const approval = page.locator('[data-approval="sign-off"]');
    // Alice owns this run, but bob is its approver: she sees it wait, with nothing to press.
    await page.goto(`${asAlice.url}/#/run/${forBob.id}`);
    await approval.and(page.locator('[data-decision="waiting"]')).waitFor({ timeout: 10_000 });
    expect(await approval.textContent()).toContain("asked of bob");
    expect(await approval.locator("button").count()).toBe(0);
    // A viewer sees every run, and decides none.
    const viewer = await logIn(logins.viewer.at(-1) as string);
    const viewerPage = viewer.pages()[0];
    await viewerPage?.goto(`${viewerUrl}/#/run/${forAlice.id}`);
    await viewerPage?.locator('[data-approval="sign-off"][data-decision="waiting"]').waitFor({ timeout: 10_000 });
    expect(await viewerPage?.locator('[data-approval="sign-off"] button').count()).toBe(0);
    await viewer.close();
    // Where she is the approver, she rejects it from the page: the run fails and its next step never starts.
    await page.goto(`${asAlice.url}/#/run/${forAlice.id}`);
    await approval.locator("[data-comment]").fill("not this week");
    await approval.locator('[data-action="reject"]').click();
    await approval.and(page.locator('[data-decision="rejected"]')).waitFor({ timeout: 10_000 });
    await page.locator('h1 [data-state="failed"]').waitFor({ timeout: 10_000 });
    const rejected = await alice.client.getRun(forAlice.id);
    expect(rejected.steps["sign-off"]?.approval).toMatchObject({ decision: "rejected", by: "alice", comment: "not this week" });
    expect(rejected.steps.after?.instances ?? []).toEqual([]);
    expect((await alice.client.getRun(forBob.id)).steps["sign-off"]?.approval?.decision).toBeUndefined();
    await alice.client.cancelRun(forBob.id);
    // Bob's run, with alice its approver: her page reads it (not its events: it reads it again
    // every few seconds) and approves it.
    const bobs = (await bob.client.startRun({ workflow: { name: "bobs", steps: steps(["alice"]) } })).run;
    await expect(alice.client.cancelRun(bobs.id)).rejects.toMatchObject({ code: "not_found" });
    // She finds it among the runs awaiting her decision, and opens it from there.
    await page.goto(`${asAlice.url}/#/runs`);
    await page.locator('input[name="awaiting"]').check();
    await page.locator(`tr[data-run="${bobs.id}"]`).waitFor({ timeout: 10_000 });
    // Not hers to decide (forBob), or decided (forAlice): not listed.
    expect(await page.locator("tr[data-run]").count()).toBe(1);
    await page.locator(`tr[data-run="${bobs.id}"] a`).click();
    expect(page.url()).toContain(`#/run/${bobs.id}`);
    await approval.and(page.locator('[data-decision="waiting"]')).waitFor({ timeout: 10_000 });
    await approval.locator('[data-action="approve"]').click();
    await approval.and(page.locator('[data-decision="approved"]')).waitFor({ timeout: 10_000 });
    expect((await bob.client.getRun(bobs.id)).steps["sign-off"]?.approval).toMatchObject({ decision: "approved", by: "alice" });
    await bob.client.cancelRun(bobs.id);
    await context.close();
  }, 60_000);

  test("a viewer's page shows every job with no cancel, and the credential it holds cannot cancel or reach JetStream", async () => {
    const job = (await bob.client.submit({ agent: "sleeper", input: null })).job;
    const context = await logIn(logins.viewer.at(-1) as string);
    const page = context.pages()[0];
    if (!page) throw new Error("no page");
    expect(await page.locator("[data-who]").textContent()).toBe("viewer viewer");
    await page.goto(`${viewerUrl}/#/job/${job.id}`);
    await page.locator('h1 [data-state="running"]').waitFor({ timeout: 20_000 });
    expect(await page.locator('[data-action="cancel"]').count()).toBe(0);

    // What a script in the page could get: the same credential, used directly.
    const cookie = (await context.cookies()).find((c) => c.name.startsWith("boxcar_ui_"));
    const session = await postSession(viewerUrl, { cookie: `${cookie?.name}=${cookie?.value}` });
    await using dir = await scratch("boxcar-ui-creds-");
    const file = join(dir.path, "page.creds");
    await writeFile(file, String(session.body.creds), { mode: 0o600 });
    const connection = resolveConnection({ flags: { nats: system.url, creds: file }, env: {} });
    const nc = await connectNats(connection, "stolen-viewer");
    const client = createClient({ nc, names: alice.names }, { identity: connection.identity });
    await expect(client.cancelJob(job.id)).rejects.toMatchObject({ code: "forbidden" });
    await expect(nc.request(`$JS.API.STREAM.PURGE.${alice.names.streams.work}`, "", { timeout: 2_000 })).rejects.toThrow(
      /Permissions Violation/i,
    );
    expect((await bob.client.getJob(job.id)).state).toBe("running");
    await nc.close();
    await bob.client.cancelJob(job.id);
    await context.close();
  }, 60_000);

  test("a page from another origin cannot use the WebSocket listener; the dashboard's own origin can", async () => {
    const context = await browser.newContext();
    const page = await context.newPage();
    const { port } = evil.address() as AddressInfo;
    await page.goto(`http://127.0.0.1:${port}/`);
    await expect.poll(() => page.title(), { timeout: 10_000 }).toContain("closed");
    expect(await page.title()).not.toContain("got INFO");
    // The control: the same script from the dashboard's origin gets the server's INFO.
    const own = await context.newPage();
    await own.goto(`${viewerUrl}/`);
    const seen = await own.evaluate(
      (url) =>
        new Promise<string>((resolve) => {
          const ws = new WebSocket(url);
          ws.binaryType = "arraybuffer";
          ws.onmessage = (e) => resolve(new TextDecoder().decode(e.data as ArrayBuffer).slice(0, 4));
          ws.onclose = () => resolve("closed");
        }),
      `ws://127.0.0.1:${wsPort}`,
    );
    expect(seen).toBe("INFO");
    await context.close();
  });

  test("no session under a foreign Host or Origin, without a login, or for a revoked user", async () => {
    const { port } = new URL(viewerUrl);
    const fresh = logins.viewer.at(-1) as string;
    const token = new URL(fresh).hash.slice(3);
    // DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends its own Host.
    expect((await postSession(viewerUrl, { host: `evil.example:${port}`, authorization: `Bearer ${token}` })).status).toBe(421);
    expect((await postSession(viewerUrl, { origin: "http://evil.example", authorization: `Bearer ${token}` })).status).toBe(403);
    expect((await postSession(viewerUrl, {})).status).toBe(401);
    expect((await postSession(viewerUrl, { authorization: "Bearer not-a-token" })).status).toBe(401);
    // The token was not spent by the refused requests: it still logs in once.
    const ok = await postSession(viewerUrl, { authorization: `Bearer ${token}` });
    expect(ok.status).toBe(200);

    const login = await postSession(asAlice.url, { authorization: `Bearer ${new URL(logins.alice.at(-1) as string).hash.slice(3)}` });
    expect(login.status).toBe(200);
    await system.auth.revoke("alice");
    const after = await postSession(asAlice.url, { cookie: login.cookie as string });
    expect(after.status).toBe(403);
    expect(String(after.body.error)).toContain("alice");
  });

  test("an unused login link expires and a fresh one is printed; behind a TLS proxy the https origin logs in with a Secure cookie", async () => {
    const links: string[] = [];
    const proxied = await startUiServer({
      host: "127.0.0.1",
      port: 0,
      natsWs: `wss://dash.example:4281`,
      prefix: alice.names.prefix,
      principal: { authDir: system.auth.dir, role: "viewer", user: "viewer" },
      hostNames: ["https://dash.example"],
      loginLinkTtlMs: 300,
      onLoginUrl: (url) => links.push(url),
    });
    try {
      expect(links[0]).toMatch(/^https:\/\/dash\.example\/#t=/);
      await eventually(async () => (links.length >= 3 ? true : undefined), "two fresh links after two expiries", 5_000);
      const listening = `http://127.0.0.1:${new URL(proxied.origins.find((o) => o.startsWith("http://127.0.0.1")) as string).port}`;
      const token = (link: string) => `Bearer ${new URL(link).hash.slice(3)}`;
      const proxy = { host: "dash.example", origin: "https://dash.example" };
      expect((await postSession(listening, { ...proxy, authorization: token(links[0] as string) })).status).toBe(401);
      const fresh = await postSession(listening, { ...proxy, authorization: token(links.at(-1) as string) });
      expect(fresh.status).toBe(200);
      expect(fresh.setCookie).toContain("; Secure");
    } finally {
      await proxied.close();
    }
  });

  test("boxcar ui refuses to give a browser an admin credential, and an open server's dashboard beyond this machine", async () => {
    const result = await boxcar(system.url, alice.names.prefix, [
      "ui",
      "--nats-ws",
      `ws://127.0.0.1:${wsPort}`,
      "--auth-dir",
      system.auth.dir,
      "--as",
      "admin:admin",
    ]);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("does not belong in a browser");
    const open = await boxcar(system.url, alice.names.prefix, ["ui", "--nats-ws", `ws://127.0.0.1:${wsPort}`, "--listen", "0.0.0.0:0"]);
    expect(open.code).toBe(2);
    expect(open.stderr).toContain("--auth-dir");
  });
});
