import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { TopologyOptions } from "@boxcar/fabric";
import { createHostSandboxProvider, createWorker, type Worker, type WorkerOptions } from "@boxcar/worker";
import { type NatsFixture, natsFixture } from "./nats.js";

/** A whole Boxcar system in this process: a real nats-server, a dispatcher, a running worker and a client. */
export interface LocalSystem extends AsyncDisposable {
  /** The server, its credentials, and an admin's connection and topology (to read or write anything). */
  readonly nats: NatsFixture;
  readonly dispatcher: Dispatcher;
  readonly worker: Worker;
  /** The SDK's client, as an admin: apply agents, submit jobs, wait for them, read their events. */
  readonly client: BoxcarClient;
  /** Stops the worker, then the dispatcher, then the server (its store removed). Safe to call twice. */
  close(): Promise<void>;
}

/** The worker's options, but for what the system gives it (its topology and the dispatcher's keys). */
export type LocalWorkerOptions = Omit<Partial<WorkerOptions>, "topology" | "dispatcherKeys">;

export interface LocalSystemOptions {
  /** The system's topology: its prefix (default: one of its own), lease, replicas... */
  topology?: TopologyOptions;
  /**
   * The worker's options (default: host sandboxes only), or a function making them once the
   * server runs: a Docker sandbox provider needs the system's prefix and id
   * (`nats.topology.names.prefix`, `nats.topology.systemId`).
   */
  worker?: LocalWorkerOptions | ((nats: NatsFixture) => LocalWorkerOptions);
}

/**
 * Starts a whole Boxcar system in this process, for tests: a real nats-server on a free port with
 * a temporary store and authentication on (each role on its own credential), a dispatcher, a
 * worker pulling work (host sandboxes unless `worker` says otherwise) and a client. Like Temporal's
 * `TestWorkflowEnvironment.createLocal()`: a test applies its agents with `client`, submits jobs,
 * waits for them and asserts on what they did. Dispose it (`await using`) or `close()` it.
 */
export async function localSystem(opts: LocalSystemOptions = {}): Promise<LocalSystem> {
  const nats = await natsFixture(opts.topology);
  const started = await startRoles(nats, opts.worker).catch(async (err) => {
    await nats[Symbol.asyncDispose]();
    throw err;
  });
  const { dispatcher, worker } = started;
  void worker.run();
  let closed: Promise<void> | undefined;
  const close = () => {
    closed ??= (async () => {
      await worker.close();
      await dispatcher.close();
      await nats[Symbol.asyncDispose]();
    })();
    return closed;
  };
  return { nats, dispatcher, worker, client: createClient(nats.topology), close, [Symbol.asyncDispose]: close };
}

/** The dispatcher, and the worker made (not yet running); the dispatcher closed again when the worker cannot be made. */
async function startRoles(nats: NatsFixture, opts: LocalSystemOptions["worker"]): Promise<{ dispatcher: Dispatcher; worker: Worker }> {
  const workerOpts = typeof opts === "function" ? opts(nats) : opts;
  const dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  try {
    return { dispatcher, worker: createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()], ...workerOpts }) };
  } catch (err) {
    await dispatcher.close();
    throw err;
  }
}
