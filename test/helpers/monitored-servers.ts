import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { AuthDir } from "@boxcar/auth";
import { type BoxcarClient, connectNats, createClient, type ResolvedConnection, resolveConnection } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import { freePort, type NatsServer, openTopology, startNatsServer, type Topology, WorkSigner } from "@boxcar/fabric";
import { createHostSandboxProvider, createWorker, type Worker } from "@boxcar/worker";
import { jetstreamManager } from "@nats-io/jetstream";
import { connect, credsAuthenticator, type NatsConnection } from "@nats-io/transport-node";

/**
 * One nats-server, or a three-server JetStream cluster, running an auth folder's `auth.conf`
 * (operator mode, as `boxcar auth init` writes it, or the text given), each with a monitoring
 * endpoint, laid out as KEDA's nats-jetstream scaler needs to find servers: server `i` listens on
 * 127.0.0.(2+i), and all of them use one monitoring port. On a cluster the scaler takes each
 * server's host from its advertised client URLs (`/varz` `connect_urls`), drops the port and adds
 * the monitoring port it was configured with (helpers/keda-scaler.ts), so servers that differ only
 * by port cannot be told apart. Each server has its own account resolver folder.
 */
export interface MonitoredServers extends AsyncDisposable {
  /** Client URLs, in order. */
  readonly urls: readonly string[];
  /** `host:port` of server 0's monitoring endpoint: a trigger's `natsServerMonitoringEndpoint`. */
  readonly monitoringEndpoint: string;
  /** `http://host:port` of every server's monitoring endpoint, in order. */
  readonly monitors: readonly string[];
  readonly servers: readonly NatsServer[];
  /** Connects as one of the auth folder's users (to any server of the cluster). */
  connectAs(user: string): Promise<{ nc: NatsConnection; connection: ResolvedConnection }>;
  /**
   * Stops server `i` (SIGTERM) and starts it again on the same ports, store and resolver folder,
   * as a rolling restart does; on a cluster, resolves once the meta group has it back.
   */
  restart(i: number): Promise<void>;
}

const ATTEMPTS = 4;

export async function monitoredServers(auth: AuthDir, opts: { size: 1 | 3; authConf?: string }): Promise<MonitoredServers> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start(auth, opts.size, opts.authConf ?? (await readFile(join(auth.dir, "auth.conf"), "utf8")));
    } catch (err) {
      const message = (err as Error).message;
      if (attempt === ATTEMPTS || !/already in use|not ready|no meta leader|no JetStream|EADDRINUSE/.test(message)) throw err;
      process.stderr.write(`monitoredServers: starting again (attempt ${attempt + 1} of ${ATTEMPTS}): ${message}\n`);
    }
  }
}

async function start(auth: AuthDir, size: number, authConf: string): Promise<MonitoredServers> {
  const root = await mkdtemp(join(tmpdir(), "boxcar-monitored-"));
  const hosts = Array.from({ length: size }, (_, i) => `127.0.0.${i + 2}`);
  const monitorPort = await portFreeOn(hosts);
  const ports = await Promise.all(hosts.map(() => freePort()));
  const clusterPorts = await Promise.all(hosts.map(() => freePort()));
  const clusterName = `k${Math.random().toString(36).slice(2, 8)}`;
  const servers: NatsServer[] = [];
  const connections: NatsConnection[] = [];
  const dispose = async () => {
    for (const c of connections) await c.close().catch(() => {});
    await Promise.all(servers.map((s) => s.stop()));
    await rm(root, { recursive: true, force: true });
  };
  const startOne = async (i: number) => {
    const host = hosts[i] as string;
    const conf = authConf.replace(/dir: "[^"]*"/, `dir: ${JSON.stringify(join(root, `jwt-${i}`))}`);
    servers[i] = await startNatsServer({
      host,
      port: ports[i] as number,
      storeDir: join(root, `n${i}`),
      serverName: `${clusterName}-n${i}`,
      extraConfig: `${conf}\nhttp: ${JSON.stringify(`${host}:${monitorPort}`)}\n`,
      ...(size > 1
        ? {
            cluster: {
              name: clusterName,
              port: clusterPorts[i] as number,
              routes: clusterPorts.map((p) => `nats-route://127.0.0.1:${p}`),
            },
          }
        : {}),
    });
  };
  const monitors = hosts.map((h) => `http://${h}:${monitorPort}`);
  try {
    await Promise.all(hosts.map((_, i) => startOne(i)));
    if (size > 1) await waitForMetaGroup(monitors, size);
    const urls = servers.map((s) => s.url);
    await waitForAccountJetStream(auth, urls);
    return {
      urls,
      monitoringEndpoint: `${hosts[0]}:${monitorPort}`,
      monitors,
      servers,
      async connectAs(user) {
        const connection = resolveConnection({ flags: { nats: urls.join(","), creds: auth.credsFile(user) }, env: {} });
        const nc = await connectNats(connection, `test-${user}`);
        connections.push(nc);
        return { nc, connection };
      },
      async restart(i) {
        // Under a loaded suite a restarted server once stayed out of the meta group for the 30 s
        // waited (the leader listed no replicas at all): it is restarted once more before giving up.
        for (let attempt = 1; ; attempt++) {
          await servers[i]?.stop();
          await startOne(i);
          if (size === 1) break;
          try {
            await waitForMetaGroup(monitors, size);
            break;
          } catch (err) {
            if (attempt === 2) throw err;
            process.stderr.write(`monitoredServers: server ${i} restarted again: ${(err as Error).message}\n`);
          }
        }
        await waitForAccountJetStream(auth, [(servers[i] as NatsServer).url]);
      },
      [Symbol.asyncDispose]: dispose,
    };
  } catch (err) {
    await dispose();
    throw err;
  }
}

/** Until the meta group has a leader that sees every other server current. */
async function waitForMetaGroup(monitors: readonly string[], size: number, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  const last = new Map<string, string>(); // what each server said last
  while (Date.now() < deadline) {
    for (const m of monitors) {
      try {
        const jsz = (await (await fetch(`${m}/jsz`, { signal: AbortSignal.timeout(2_000) })).json()) as {
          meta_cluster?: { leader?: string; cluster_size?: number; replicas?: { current?: boolean }[] };
        };
        const meta = jsz.meta_cluster;
        last.set(m, JSON.stringify(meta));
        if (meta?.cluster_size === size && (meta.replicas ?? []).filter((r) => r.current).length === size - 1) return;
      } catch (err) {
        last.set(m, (err as Error).message);
      }
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  const said = [...last].map(([m, what]) => `${m}: ${what}`).join("; ");
  throw new Error(`no meta leader with all ${size} servers current within ${ms} ms: ${said}`);
}

/**
 * Until each server answers JetStream requests for the Boxcar account (an admin connected to it
 * alone): a server registers an account when a client of it first needs it, and one asked just
 * after the cluster formed (or it restarted) answered "JetStream not enabled for account" (10039).
 */
async function waitForAccountJetStream(auth: AuthDir, urls: readonly string[], ms = 30_000): Promise<void> {
  const creds = await readFile(auth.credsFile("admin"));
  for (const url of urls) {
    const deadline = Date.now() + ms;
    for (;;) {
      let nc: NatsConnection | undefined;
      try {
        nc = await connect({ servers: url, authenticator: credsAuthenticator(creds), reconnect: false, name: "monitored-probe" });
        await (await jetstreamManager(nc, { timeout: 2_000 })).getAccountInfo();
        break;
      } catch (err) {
        if (Date.now() > deadline) throw new Error(`no JetStream for the account at ${url} within ${ms} ms: ${(err as Error).message}`);
        await new Promise((r) => setTimeout(r, 250));
      } finally {
        await nc?.close().catch(() => {});
      }
    }
  }
}

/** A port free on every one of `hosts`. */
async function portFreeOn(hosts: readonly string[]): Promise<number> {
  for (;;) {
    const port = await freePort();
    const free = await Promise.all(
      hosts.map(
        (host) =>
          new Promise<boolean>((resolve) => {
            const probe = createServer();
            probe.once("error", () => resolve(false));
            probe.listen(port, host, () => probe.close(() => resolve(true)));
          }),
      ),
    );
    if (free.every(Boolean)) return port;
  }
}

/** A Boxcar system on `MonitoredServers`, each role on its own credential of the auth folder. */
export interface BoxcarRoles extends AsyncDisposable {
  /** The admin's topology and client: apply agents, submit jobs. */
  readonly topology: Topology;
  readonly client: BoxcarClient;
  readonly dispatcher: Dispatcher;
  /** Starts a worker of the `default` pool that runs host agents (stopped on dispose). */
  startWorker(concurrency: number): Worker;
}

export async function boxcarRoles(servers: MonitoredServers, auth: AuthDir): Promise<BoxcarRoles> {
  const prefix = auth.prefix;
  const admin = await servers.connectAs("admin");
  const topology = await openTopology(admin.nc, { prefix });
  const d = await servers.connectAs("dispatcher");
  const dispatcher = await startDispatcher({
    topology: await openTopology(d.nc, { prefix }),
    signer: new WorkSigner(d.connection.seed as Uint8Array),
  });
  const w = await servers.connectAs("worker");
  const workerTopology = await openTopology(w.nc, { prefix });
  const workers: Worker[] = [];
  return {
    topology,
    client: createClient(topology),
    dispatcher,
    startWorker(concurrency) {
      const worker = createWorker({
        topology: workerTopology,
        dispatcherKeys: auth.dispatcherKeys(),
        concurrency,
        providers: [createHostSandboxProvider()],
        policy: { host: "always" },
      });
      workers.push(worker);
      void worker.run();
      return worker;
    },
    async [Symbol.asyncDispose]() {
      for (const worker of workers) await worker.close().catch(() => {});
      await dispatcher.close().catch(() => {});
    },
  };
}
