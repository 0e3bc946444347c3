import { type BoxcarClient, createClient, openTopology, type Topology } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import { isTerminal, type JobRecord, type JobSpecInput } from "@boxcar/protocol";
import { createWorker, type SandboxProvider, type Worker } from "@boxcar/worker";
import { KvWatchInclude } from "@nats-io/kv";
import { type ConnectionOptions, connect, type NatsConnection } from "@nats-io/transport-node";
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
}

/** Every revision of a job record the shared watcher saw, with when it saw it. */
export type RecordListener = (record: JobRecord, seenAt: number) => void;

export interface BoxcarPath extends AsyncDisposable {
  run: RunJob;
  /** Submits no-op job `i` with extra spec fields; resolves with its id once it is admitted. */
  submit(i: number, extra?: Partial<JobSpecInput>): Promise<string>;
  /** Resolves once job `id`'s final record is seen. */
  done(id: string): Promise<void>;
  connections: { client: NatsConnection; dispatcher: NatsConnection; worker: NatsConnection };
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
  const conn = (name: string) => connect({ ...opts.connectOptions, servers: opts.url, name: `${opts.prefix}-${name}` });
  const connections = { client: await conn("client"), dispatcher: await conn("dispatcher"), worker: await conn("worker") };
  const topology = async (nc: NatsConnection): Promise<Topology> => openTopology(nc, { prefix: opts.prefix });
  const clientTopology = await topology(connections.client);
  const dispatcher: Dispatcher = await startDispatcher({ topology: await topology(connections.dispatcher) });
  const worker: Worker = createWorker({
    topology: await topology(connections.worker),
    concurrency: opts.concurrency,
    providers: opts.providers,
    workerId: `${opts.prefix}-worker`,
  });
  void worker.run();

  const client: BoxcarClient = createClient(clientTopology);
  // `trusted`: the default worker policy runs only trusted agents on the host.
  await client.applyAgent({ name: AGENT, command: ["true"], runtime: { sandbox: opts.sandbox ?? "host" }, trusted: true });

  const completions = new Completions();
  let unsuccessful = 0;
  let listener: RecordListener | undefined;
  const watch = await clientTopology.jobs.watch({ include: KvWatchInclude.UpdatesOnly });
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

  const submit = async (i: number, extra: Partial<JobSpecInput> = {}) => (await client.submit({ ...extra, agent: AGENT, input: i })).job.id;
  const run: RunJob = async (i) => completions.wait(await submit(i));

  return {
    run,
    submit,
    done: (id) => completions.wait(id),
    connections,
    get unsuccessful() {
      return unsuccessful;
    },
    listen(next) {
      listener = next;
    },
    async [Symbol.asyncDispose]() {
      await worker.close();
      await dispatcher.close();
      watch.stop();
      await watching;
      for (const nc of Object.values(connections)) await nc.drain();
    },
  };
}
