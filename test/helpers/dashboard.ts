import { mkdir } from "node:fs/promises";
import { type BoxcarClient, connectNats, createClient, resolveConnection } from "@boxcar/client";
import { names } from "@boxcar/protocol";
import { eventually } from "@boxcar/testing";
import type { NatsConnection } from "@nats-io/transport-node";
import { type Browser, chromium, type Page } from "playwright-core";
import { SCREENSHOTS } from "./browser.js";
import { exited } from "./cli.js";
import { spawnUp, type UpProcess } from "./up.js";

/** `boxcar up` serving its dashboard, a client of the system it runs, and Chromium to open the dashboard's pages. */
export interface UpDashboard extends AsyncDisposable {
  readonly up: UpProcess;
  /** The dashboard's address, as `boxcar up` printed it. */
  readonly url: string;
  readonly nc: NatsConnection;
  readonly client: BoxcarClient;
  /** A fresh page on the dashboard, failing the test on any script error in it; `sent` collects what it sends over its WebSocket. */
  open(path?: string, sent?: string[]): Promise<Page>;
}

/**
 * Runs `boxcar up --ui 0` (with `env` added to its environment), connects to its server as
 * `name`, and launches the Chromium at `chromiumPath`; screenshots go to `SCREENSHOTS`. Disposing
 * it closes the browser and the connection, then stops `boxcar up` (SIGINT) and removes its folder.
 */
export async function upDashboard(name: string, chromiumPath: string, env: NodeJS.ProcessEnv = {}): Promise<UpDashboard> {
  const up = await spawnUp(["--ui", "0"], undefined, env);
  let nc: NatsConnection | undefined;
  let browser: Browser | undefined;
  const dispose = async () => {
    await browser?.close();
    await nc?.close();
    up.child.kill("SIGINT");
    await exited(up.child);
    await up[Symbol.asyncDispose]();
  };
  try {
    const url = await eventually(
      async () => /dashboard: (http:\/\/\S+)/.exec(up.output())?.[1],
      "boxcar up to print its dashboard",
      30_000,
    );
    const connected = await connectNats(resolveConnection({ flags: { nats: `nats://127.0.0.1:${up.port}` }, env: {} }), name);
    nc = connected;
    const launched = await chromium.launch({ executablePath: chromiumPath });
    browser = launched;
    await mkdir(SCREENSHOTS, { recursive: true });
    return {
      up,
      url,
      nc: connected,
      client: createClient({ nc: connected, names: names() }),
      async open(path = "", sent) {
        const page = await launched.newPage({ viewport: { width: 1280, height: 860 }, acceptDownloads: true });
        page.on("pageerror", (err) => {
          throw err;
        });
        if (sent) page.on("websocket", (ws) => ws.on("framesent", (frame) => sent.push(String(frame.payload))));
        await page.goto(`${url}/${path}`);
        await page.locator("[data-who]").waitFor();
        return page;
      },
      [Symbol.asyncDispose]: dispose,
    };
  } catch (err) {
    await dispose();
    throw err;
  }
}
