import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import type { AuthDir } from "@boxcar/auth";
import { resolveConnection } from "@boxcar/client";
import { freePort, type NatsServer, startNatsServer, WorkSigner } from "@boxcar/fabric";
import { isTerminal } from "@boxcar/protocol";
import type { UiServer, UiServerOptions } from "@boxcar/ui";
import type { Worker } from "@boxcar/worker";
import { cliPackageDir } from "../cli-package.js";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { logFormat, positiveInt, readLogFormat, wholeNumber } from "../flags.js";
import { createLogger } from "../logger.js";
import { describeEvent, describeJob } from "../output.js";
import { openRoleSession, systemOptions, systemOptionsFrom } from "../role-session.js";
import { UsageError } from "../usage-error.js";
import { readAgentFile } from "./agent.js";
import { serveDashboard } from "./ui.js";

/** Where `boxcar up` serves the dashboard unless told otherwise (a free port when this one is taken). */
const DASHBOARD_PORT = 4280;

/** The examples shipped with Boxcar, at the root of the checkout this CLI runs from. */
const exampleAgents = () => join(cliPackageDir(), "../../examples/agents");

const DEMO_INPUT = { prompt: "Write a short report about Boxcar", sections: ["queue", "workers", "sandboxes"] };

export const up: Command = {
  usage:
    "boxcar up [--port 4222] [--listen 127.0.0.1] [--auth] [--data .boxcar/data] [--workers 2] [--concurrency 4] [--agents DIR]... [--demo] [--ui PORT|off] [--trace-url URL-WITH-{traceId}] [--replicas 1] [--stream-limits events=SIZE,logs=SIZE,dead=SIZE] [--log-format json|pretty]",
  maxArgs: 0,
  options: {
    port: { type: "string" },
    listen: { type: "string" },
    auth: { type: "boolean", default: false },
    data: { type: "string" },
    workers: { type: "string" },
    concurrency: { type: "string" },
    agents: { type: "string", multiple: true, default: [] },
    demo: { type: "boolean", default: false },
    ui: { type: "string" },
    "trace-url": { type: "string" },
    ...systemOptions,
    ...logFormat,
  },
  async run(ctx) {
    const port = positiveInt(ctx.values.port, "--port", 4222, 65_535);
    const workerCount = positiveInt(ctx.values.workers, "--workers", 2);
    const concurrency = positiveInt(ctx.values.concurrency, "--concurrency", 4);
    const agentDirs = (ctx.values.agents as string[]).length > 0 ? (ctx.values.agents as string[]) : [exampleAgents()];
    const storeDir = resolve((ctx.values.data as string | undefined) ?? join(".boxcar", "data"));
    const demo = ctx.values.demo as boolean;
    const listen = (ctx.values.listen as string | undefined) ?? "127.0.0.1";
    const withAuth = ctx.values.auth as boolean;
    if (!withAuth && !isLoopback(listen)) {
      throw new UsageError(
        `--listen ${listen} lets other machines reach NATS, and whoever reaches it without authentication can run code on the workers: add --auth`,
      );
    }
    // One local server holds one copy; more replicas need a cluster (`boxcar dispatcher/worker --nats`).
    const { replicas, streamLimits } = systemOptionsFrom(ctx.values, ctx.io.env);
    if (replicas !== undefined && replicas !== 1) {
      throw new UsageError(
        `boxcar up runs a single nats-server, which keeps 1 replica: --replicas / BOXCAR_REPLICAS must be 1, got ${replicas}`,
      );
    }
    const logger = createLogger(readLogFormat(ctx.values["log-format"]), ctx.io.env.BOXCAR_LOG_LEVEL ?? (demo ? "warn" : "info"));
    // The roles' packages, loaded once the command line is checked: `up --help` and a bad flag answer without them.
    const [{ startDispatcher }, { createWorker }] = await Promise.all([import("@boxcar/dispatcher"), import("@boxcar/worker")]);

    // Every agent file must be valid before anything starts.
    const definitions = [];
    for (const dir of agentDirs) {
      if (!existsSync(dir)) throw new UsageError(`--agents ${dir}: no such folder`);
      for (const file of (await readdir(dir)).filter((f) => /\.ya?ml$/.test(f)).sort()) {
        definitions.push(await readAgentFile(join(dir, file)));
      }
    }

    const say = (line: string) => ctx.io.stderr.write(`${line}\n`);
    const cleanup: (() => Promise<unknown>)[] = [];
    const prefix = ctx.values.prefix as string | undefined;
    const auth = withAuth ? await openAuthDir(join(dirname(storeDir), "auth"), prefix) : undefined;
    const loginUrls: string[] = [];
    // The demo ends with its job: a dashboard only if asked for.
    const traceUrl = ctx.values["trace-url"] as string | undefined;
    const dashboard = await startDashboard(ctx.values.ui ?? (demo ? "off" : undefined), {
      prefix: prefix ?? "boxcar",
      ...(traceUrl !== undefined ? { traceUrl } : {}),
      ...(auth ? { principal: { authDir: auth.dir, role: "viewer" as const, user: "viewer" } } : {}),
      onLoginUrl: (url) => (loginUrls.length === 0 ? loginUrls.push(url) : say(`  dashboard: next login link ${url}`)),
    });
    if (dashboard) cleanup.push(() => dashboard.server.close());
    const server: NatsServer = await startNatsServer({
      port,
      host: listen,
      storeDir,
      serverName: "boxcar-up",
      ...(dashboard ? { websocket: { host: "127.0.0.1", port: dashboard.wsPort, allowedOrigins: dashboard.server.origins } } : {}),
      ...(auth ? { extraConfig: await readFile(join(auth.dir, "auth.conf"), "utf8") } : {}),
    }).catch(async (err: unknown) => {
      await dashboard?.server.close();
      throw err;
    });
    cleanup.unshift(() => server.stop());
    if (server.leftoverStopped !== undefined) {
      say(`stopped the nats-server (pid ${server.leftoverStopped}) an earlier boxcar up left running on ${storeDir}`);
    }
    try {
      // With --auth each role connects with its own credential, as it would on other machines.
      const as = async (role: "admin" | "dispatcher" | "worker") => {
        const creds = auth ? { creds: auth.credsFile(role) } : {};
        const session = await openRoleSession(
          resolveConnection({ flags: { nats: server.url, ...creds }, env: {} }),
          prefix,
          `boxcar-up-${role}`,
          logger,
          streamLimits ? { streamLimits } : {},
        );
        cleanup.unshift(async () => await session[Symbol.asyncDispose]());
        return session;
      };
      const dispatching = await as("dispatcher");
      const seed = dispatching.connection.seed;
      const dispatcher = await startDispatcher({
        topology: dispatching.topology,
        logger,
        ...(seed ? { signer: new WorkSigner(seed) } : {}),
      });
      cleanup.unshift(() => dispatcher.close());
      const working = await as("worker");
      const workers: Worker[] = [];
      for (let i = 0; i < workerCount; i++) {
        const w = createWorker({
          topology: working.topology,
          logger,
          concurrency,
          drainGraceMs: 10_000,
          ...(auth ? { dispatcherKeys: auth.dispatcherKeys() } : {}),
        });
        workers.push(w);
        w.run().catch((err: unknown) => logger.error({ err, workerId: w.id }, "worker stopped on an error"));
      }
      cleanup.unshift(() => Promise.allSettled(workers.map((w) => w.drain().then(() => w.close()))));
      const session = await as("admin");
      for (const definition of definitions) await session.client.applyAgent(definition);

      say(`boxcar is up: NATS ${server.url}${isLoopback(listen) ? "" : ` (listening on ${listen})`} (JetStream data in ${storeDir})`);
      if (auth) say(`  authentication on: credentials in ${auth.dir}; commands run in this folder use admin.creds`);
      say(`  1 dispatcher, ${workerCount} workers x ${concurrency} jobs, agents: ${definitions.map((d) => d.name).join(", ") || "(none)"}`);
      if (dashboard) {
        say(auth ? `  dashboard (as viewer): log in at ${loginUrls[0]} (the link works once)` : `  dashboard: ${dashboard.server.url}`);
      }
      if (demo) return await runDemo(ctx, session.client, say);
      say("");
      say(`  export BOXCAR_NATS_URL=${server.url}`);
      say(`  boxcar submit hello --prompt "hi" --follow`);
      say("  boxcar jobs");
      say("");
      say("Ctrl-C stops everything.");
      await new Promise((r) => ctx.io.signal.addEventListener("abort", r, { once: true }));
      say("stopping: draining workers...");
      return ExitCode.ok;
    } finally {
      for (const step of cleanup) await step().catch((err) => logger.warn({ err }, "shutdown step failed"));
    }
  },
};

async function runDemo(ctx: Parameters<Command["run"]>[0], client: import("@boxcar/client").BoxcarClient, say: (l: string) => void) {
  say(`\ndemo: boxcar submit report --input '${JSON.stringify(DEMO_INPUT)}' --follow\n`);
  const { job } = await client.submit({ agent: "report", input: DEMO_INPUT });
  const logs = (async () => {
    for await (const chunk of client.logs(job.id, { follow: true, signal: ctx.io.signal })) ctx.io.stdout.write(chunk.data);
  })();
  for await (const event of client.events(job.id, { follow: true, signal: ctx.io.signal })) say(describeEvent(event));
  await logs;
  const final = await client.getJob(job.id);
  say(`\n${describeJob(final)}`);
  if (isTerminal(final.state) && final.artifacts.length > 0) {
    const dir = resolve(".boxcar", "demo-artifacts", job.id);
    const written = await client.downloadArtifacts(job.id, dir);
    say(`\nartifacts downloaded to ${dir}:`);
    for (const file of written) say(`  ${file}`);
  }
  say("\nnext: ./bin/boxcar up keeps it running, with a live dashboard at the address it prints");
  return final.state === "succeeded" ? ExitCode.ok : ExitCode.jobFailed;
}

/**
 * The dashboard of `boxcar up`, on this machine only (`--ui PORT`, or `off`), with a free port
 * for NATS's WebSocket listener: it must be known before the server starts, since a server cannot
 * take a websocket block on reload.
 */
async function startDashboard(
  flag: unknown,
  opts: Pick<UiServerOptions, "prefix" | "principal" | "onLoginUrl" | "traceUrl">,
): Promise<{ server: UiServer; wsPort: number } | undefined> {
  if (flag === "off") return undefined;
  const wsPort = await freePort();
  const base = { ...opts, host: "127.0.0.1", natsWs: `ws://127.0.0.1:${wsPort}` };
  if (flag !== undefined) return { server: await serveDashboard({ ...base, port: wholeNumber(flag, "--ui", 0, 65_535) }, "--ui"), wsPort };
  const server = await serveDashboard({ ...base, port: DASHBOARD_PORT }, "--ui").catch((err: unknown) =>
    err instanceof UsageError && err.message.startsWith("--ui") ? serveDashboard({ ...base, port: 0 }, "--ui") : Promise.reject(err),
  );
  return { server, wsPort };
}

function isLoopback(host: string): boolean {
  return host === "localhost" || host === "::1" || /^127\./.test(host);
}

/** The checkout's auth folder (`.boxcar/auth`), created on first use for `prefix`. */
async function openAuthDir(dir: string, prefix: string | undefined): Promise<AuthDir> {
  const { AuthDir } = await import("@boxcar/auth");
  const auth = existsSync(join(dir, "auth.json")) ? await AuthDir.open(dir) : await AuthDir.init(dir, prefix ? { prefix } : {});
  if (auth.prefix !== (prefix ?? "boxcar")) {
    throw new UsageError(
      `${dir} holds credentials for prefix ${auth.prefix}, not ${prefix ?? "boxcar"}: pass --prefix ${auth.prefix}, or move the folder away`,
    );
  }
  return auth;
}
