import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { connect, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Queue, QueueEvents, Worker } from "bullmq";
import { Completions, type RunJob } from "./load.js";

/** The peer users would pick instead: BullMQ on a Redis started here. */
export interface BullmqPath extends AsyncDisposable {
  run: RunJob;
}

/** A `redis-server` of the bench's own (Debian's package). */
export interface RedisServer extends AsyncDisposable {
  url: { host: string; port: number };
  pid: number;
}

/** The redis-server on PATH, or undefined: the bench then skips BullMQ and says so. */
export function findRedisServer(): string | undefined {
  const found = spawnSync("sh", ["-c", "command -v redis-server"], { encoding: "utf8" });
  return found.status === 0 ? found.stdout.trim() : undefined;
}

/**
 * Starts redis-server on a free port with its data in a temporary folder, written as JetStream's
 * file store writes: an append-only file synced once a second (`appendfsync everysec`), no
 * snapshots.
 */
export async function startRedisServer(binary: string): Promise<RedisServer> {
  const dir = await mkdtemp(join(tmpdir(), "boxcar-bench-redis-"));
  const port = await freePort();
  const child: ChildProcess = spawn(
    binary,
    ["--port", String(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
    { stdio: "ignore" },
  );
  const started = Date.now();
  for (;;) {
    if (await listening(port)) break;
    if (child.exitCode !== null || Date.now() - started > 10_000) {
      child.kill();
      throw new Error(`redis-server did not start on port ${port}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url: { host: "127.0.0.1", port },
    pid: child.pid ?? 0,
    async [Symbol.asyncDispose]() {
      child.kill();
      await new Promise((r) => child.once("exit", r));
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/**
 * The same shape as the raw JetStream path, the BullMQ way: `queue.add` a job with the input;
 * a `Worker` (concurrency as given) whose processor returns `{ state: "succeeded" }`; completion
 * seen by one shared `QueueEvents` listener (`completed`), as the raw path's one shared watcher.
 * BullMQ keeps finished jobs unless told not to; like Boxcar, this keeps them.
 */
export async function openBullmqPath(redis: RedisServer, tag: string, concurrency: number): Promise<BullmqPath> {
  const connection = redis.url;
  const queue = new Queue(tag, { connection });
  const events = new QueueEvents(tag, { connection });
  await events.waitUntilReady();
  const completions = new Completions();
  events.on("completed", ({ jobId }) => completions.complete(jobId));
  const worker = new Worker(tag, async () => ({ state: "succeeded", exitCode: 0 }), { connection, concurrency });
  await worker.waitUntilReady();

  const run: RunJob = async (i) => {
    const id = `b${i}`;
    const done = completions.wait(id);
    await queue.add("job", { id, input: i }, { jobId: id });
    await done;
  };
  return {
    run,
    async [Symbol.asyncDispose]() {
      await worker.close();
      await events.close();
      await queue.close();
    },
  };
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.end();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}
