/**
 * The session ports benchmark (docs/sessions.md#ports): how fast a download of `BENCH_PORTS_MB`
 * (default 50 MB) and an upload of the same goes through a tunnel, from a local port
 * (`forwardSessionPort`) to an HTTP server in a Docker session (through its helper) and in a host
 * session (the worker's own connection), next to the same download straight from the host
 * session's server (no tunnel). One system in this process (client, dispatcher and worker on
 * connections of their own) on an embedded nats-server; `BENCH_PORTS_ROUNDS` rounds (default 5),
 * the paths interleaved, after one warm-up round. `pnpm bench:session-ports`.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { cpus } from "node:os";
import { join } from "node:path";
import { openSessionSystem } from "./session-system.js";
import { envInt, gitCommit, summarize, table } from "./stats.js";

const MB = envInt("BENCH_PORTS_MB", 50);
const ROUNDS = envInt("BENCH_PORTS_ROUNDS", 5);
const SIZE = MB * 1_000_000;
const PREFIX = "benchports";

/** An HTTP server for the session: GET sends SIZE bytes, a POST answers with how many it took. */
const server = (port: number) => `
const body = Buffer.alloc(${SIZE}, "boxcar tunnel ");
require("node:http").createServer((q, s) => {
  if (q.method === "POST") { let n = 0; q.on("data", (c) => { n += c.length; }); q.on("end", () => s.end(String(n))); return; }
  s.setHeader("content-length", body.length);
  s.end(body);
}).listen(${port}, "127.0.0.1");
`;

async function freePort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
  const { port } = probe.address() as { port: number };
  await new Promise((r) => probe.close(r));
  return port;
}

/** Seconds to read a whole download (counted, not kept). */
async function download(url: string): Promise<number> {
  const started = performance.now();
  const res = await fetch(url);
  let got = 0;
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) got += chunk.length;
  if (got !== SIZE) throw new Error(`${url}: ${got} bytes of ${SIZE}`);
  return (performance.now() - started) / 1000;
}

/** Seconds to send an upload and have the server say it took it all. */
async function upload(url: string, body: Uint8Array): Promise<number> {
  const started = performance.now();
  const said = await (await fetch(url, { method: "POST", body })).text();
  if (said !== String(SIZE)) throw new Error(`${url}: the server took ${said} bytes of ${SIZE}`);
  return (performance.now() - started) / 1000;
}

const system = await openSessionSystem(PREFIX);
const { engine, client } = system;
try {
  await client.applyAgent({ name: "box", command: ["true"], sessions: true, runtime: { sandbox: "docker", limits: { memory: "1Gi" } } });
  await client.applyAgent({ name: "hosted", command: ["true"], sessions: true, trusted: true, runtime: { sandbox: "host" } });
  const docker = await client.openSession({ agent: "box" });
  const host = await client.openSession({ agent: "hosted" });
  const hostPort = await freePort();
  await client.startInSession({ id: docker.id, argv: ["node", "-e", server(8080)], timeout: "1h" });
  await client.startInSession({ id: host.id, argv: [process.execPath, "-e", server(hostPort)], timeout: "1h" });
  await using dockerForward = await client.forwardSessionPort(docker.id, 8080);
  await using hostForward = await client.forwardSessionPort(host.id, hostPort);
  const urls = {
    "Docker session, through a tunnel (helper in the container)": `http://127.0.0.1:${dockerForward.port}/`,
    "host session, through a tunnel (the worker's connection)": `http://127.0.0.1:${hostForward.port}/`,
    "host session's server straight (no tunnel)": `http://127.0.0.1:${hostPort}/`,
  };
  // The servers start (and fill their bodies) in the background: wait for each to answer.
  for (const url of Object.values(urls)) {
    for (let tries = 0; ; tries++) {
      const ok = await fetch(`${url}ready`, { method: "POST", body: "" }).then(
        (r) => r.ok,
        () => false,
      );
      if (ok) break;
      if (tries > 300) throw new Error(`${url} never answered`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  const body = Buffer.alloc(SIZE, "upload through a tunnel ");
  const samples: Record<string, { down: number[]; up: number[] }> = Object.fromEntries(
    Object.keys(urls).map((path) => [path, { down: [] as number[], up: [] as number[] }]),
  );
  for (let round = 0; round <= ROUNDS; round++) {
    for (const [path, url] of Object.entries(urls)) {
      const down = await download(url);
      const up = await upload(url, body);
      if (round > 0) {
        samples[path]?.down.push(down);
        samples[path]?.up.push(up);
      }
    }
  }
  const rate = (seconds: number) => (SIZE / 1_000_000 / seconds).toFixed(0);
  const rows = Object.entries(samples).map(([path, s]) => {
    const down = summarize(s.down);
    const up = summarize(s.up);
    return [
      path,
      rate(down.p50),
      `${rate(down.max)}-${rate(Math.min(...s.down))}`,
      rate(up.p50),
      `${rate(up.max)}-${rate(Math.min(...s.up))}`,
    ];
  });
  process.stdout.write(
    `\nA ${MB} MB download and upload through a session's port, ${ROUNDS} rounds, paths interleaved (engine ${engine.ServerVersion}, ${cpus().length} CPUs)\n\n${table(
      [["path", "down MB/s p50", "down range", "up MB/s p50", "up range"], ...rows],
    )}\n`,
  );
  await client.closeSession(docker.id);
  await client.closeSession(host.id);
  const dir = join("bench", "results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `session-ports-${new Date().toISOString().replaceAll(":", "-")}.json`);
  writeFileSync(
    file,
    `${JSON.stringify({ commit: gitCommit(), engine: engine.ServerVersion, mb: MB, rounds: ROUNDS, samples }, null, 2)}\n`,
  );
  process.stdout.write(`results: ${file}\n`);
} finally {
  await system.close();
}
