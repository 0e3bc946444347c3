import type { AuthDir } from "@boxcar/auth";
import { type BoxcarClient, connectNats, createClient, resolveConnection } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import { openTopology, type Topology, WorkSigner } from "@boxcar/fabric";
import { type AgentDefinitionInput, isTerminal, type JobRecord, type JobSpecInput, names, type SystemPolicyInput } from "@boxcar/protocol";
import { createWorker, type SandboxProvider, type Worker } from "@boxcar/worker";
import { KvWatchInclude } from "@nats-io/kv";
import { type ConnectionOptions, connect, type NatsConnection } from "@nats-io/transport-node";
import { Registry } from "prom-client";
import { Completions, type RunJob } from "./load.js";

export const AGENT = "noop";

export interface BoxcarPathOptions {
  url: string;
  /** A prefix of its own, so every scenario starts from empty streams and buckets. */
  prefix: string;
  providers: SandboxProvider[];
  concurrency: number;
  /** Extra options for every connection (the bench passes `noAsyncTraces` when asked). */
  connectOptions?: ConnectionOptions;
  /** Where the no-op agent asks to run; default the host (as a trusted agent). */
  sandbox?: "host" | "docker";
  /** The agent's command instead of `true`. */
  command?: string[];
  /** The agent asks for a warm container (`runtime.warm`). */
  warm?: boolean;
  /** The agent's flow-control limits, if any. */
  limits?: Pick<AgentDefinitionInput, "concurrency" | "rateLimit">;
  /** A system policy to set before the agent is applied (a pool's concurrency limit, say). */
  policy?: SystemPolicyInput;
  /**
   * Run with authentication, as `boxcar auth init` sets it up: the client as a submitter, the
   * dispatcher and worker on their roles' credentials, work items signed and checked.
   */
  auth?: AuthDir;
  /** With `auth`: sign and check work items (default); false leaves them unsigned, to tell the costs apart. */
  signWork?: boolean;
  /** Watch the jobs bucket on a connection of its own (an admin's), not the client's; forced with `auth`. */
  separateObserver?: boolean;
  /** Run no worker here: the jobs are for workers started elsewhere (default false). */
  noWorker?: boolean;
  /**
   * The registries the dispatcher and the worker keep their Prometheus metrics in, as a role's
   * `--metrics` endpoint gives them; default none (or one for both with BENCH_METRICS=1).
   */
  metrics?: { dispatcher: Registry; worker: Registry };
}

/** Every revision of a job record the shared watcher saw, with when it saw it. */
export type RecordListener = (record: JobRecord, seenAt: number) => void;

export interface BoxcarPath extends AsyncDisposable {
  /** Submits a job and waits for the shared watcher to see it end. */
  run: RunJob;
  /** A job as a user's program runs one: `client.submit`, then `client.waitForJob`. */
  runWithSdk: RunJob;
  /** Submits no-op job `i` with extra spec fields; resolves with its id once it is admitted. */
  submit(i: number, extra?: Partial<JobSpecInput>): Promise<string>;
  /** Resolves once job `id`'s final record is seen. */
  done(id: string): Promise<void>;
  connections: { client: NatsConnection; dispatcher: NatsConnection; worker: NatsConnection };
  /** The connection the jobs bucket is watched on: the client's, or an admin's of its own. */
  observer: NatsConnection;
  /** Jobs that ended in a state other than `succeeded`: a bench run with any is not valid. */
  readonly unsuccessful: number;
  /** Called for every record revision the watcher sees (for the breakdown). */
  listen(listener: RecordListener | undefined): void;
}

/**
 * A whole Boxcar in this process, each role on its own NATS connection as separate processes
 * would be: a client submitting over request/reply (`jobs.submit`), one dispatcher, one worker.
 * A job is done when one shared watcher on the jobs bucket sees its record in a final state.
 */
export async function openBoxcarPath(opts: BoxcarPathOptions): Promise<BoxcarPath> {
  const { auth } = opts;
  // Each role as `boxcar auth init` made it: user `submitter` for the client.
  const resolved = (user: string) =>
    resolveConnection({ flags: { nats: opts.url, ...(auth ? { creds: auth.credsFile(user) } : {}) }, env: {} });
  const conn = async (name: string, user: string) => {
    if (!auth) return connect({ ...opts.connectOptions, servers: opts.url, name: `${opts.prefix}-${name}` });
    return connectNats(resolved(user), `${opts.prefix}-${name}`);
  };
  const connections = {
    client: await conn("client", "submitter"),
    dispatcher: await conn("dispatcher", "dispatcher"),
    worker: await conn("worker", "worker"),
  };
  const topology = async (nc: NatsConnection): Promise<Topology> => openTopology(nc, { prefix: opts.prefix });
  const dispatcherSeed = resolved("dispatcher").seed;
  // BENCH_METRICS=1: both roles keep their Prometheus metrics, as with --metrics (nothing scrapes them).
  const shared = process.env.BENCH_METRICS === "1" ? new Registry() : undefined;
  const registries = opts.metrics ?? (shared ? { dispatcher: shared, worker: shared } : undefined);
  const dispatcher: Dispatcher = await startDispatcher({
    ...(registries ? { metrics: registries.dispatcher } : {}),
    topology: await topology(connections.dispatcher),
    ...(auth && dispatcherSeed && opts.signWork !== false ? { signer: new WorkSigner(dispatcherSeed) } : {}),
  });
  const worker: Worker | undefined = opts.noWorker
    ? undefined
    : createWorker({
        ...(registries ? { metrics: registries.worker } : {}),
        topology: await topology(connections.worker),
        concurrency: opts.concurrency,
        providers: opts.providers,
        workerId: `${opts.prefix}-worker`,
        ...(auth && opts.signWork !== false ? { dispatcherKeys: auth.dispatcherKeys() } : {}),
      });
  void worker?.run();

  // The agent is applied by an admin; the jobs are submitted by the client.
  const admin = await conn("admin", "admin");
  // `trusted`: the default worker policy runs only trusted agents on the host.
  const adminClient = createClient(await topology(admin), { identity: resolved("admin").identity });
  if (opts.policy) await adminClient.setPolicy(opts.policy);
  await adminClient.applyAgent({
    name: AGENT,
    command: opts.command ?? ["true"],
    runtime: { sandbox: opts.sandbox ?? "host", ...(opts.warm ? { warm: true } : {}) },
    trusted: true,
    ...opts.limits,
  });
  const client: BoxcarClient = createClient(
    { nc: connections.client, names: names(opts.prefix) },
    { identity: resolved("submitter").identity },
  );

  const completions = new Completions();
  let unsuccessful = 0;
  let listener: RecordListener | undefined;
  // The watcher reads the jobs bucket, which a submitter's credential may not: with auth, an admin watches.
  const observer = await topology(auth || opts.separateObserver ? admin : connections.client);
  const watch = await observer.jobs.watch({ include: KvWatchInclude.UpdatesOnly });
  const watching = (async () => {
    for await (const entry of watch) {
      if (entry.operation !== "PUT") continue;
      const record = entry.json<JobRecord>();
      listener?.(record, performance.now());
      if (!isTerminal(record.state)) continue;
      if (record.state !== "succeeded") unsuccessful += 1;
      completions.complete(entry.key);
    }
  })();

  const submit = async (i: number, extra: Partial<JobSpecInput> = {}) => (await client.submit({ agent: AGENT, input: i, ...extra })).job.id;
  const run: RunJob = async (i) => completions.wait(await submit(i));
  const runWithSdk: RunJob = async (i) => {
    const id = await submit(i);
    if ((await client.waitForJob(id)).state !== "succeeded") unsuccessful += 1;
    // The shared watcher saw it end too: settle its entry, or it would be kept.
    await completions.wait(id);
  };

  return {
    run,
    runWithSdk,
    submit,
    done: (id) => completions.wait(id),
    connections,
    observer: observer.nc,
    get unsuccessful() {
      return unsuccessful;
    },
    listen(next) {
      listener = next;
    },
    async [Symbol.asyncDispose]() {
      await worker?.close();
      await dispatcher.close();
      watch.stop();
      await watching;
      for (const nc of Object.values(connections)) await nc.drain();
      await admin.drain();
    },
  };
}
