import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { TopologyOptions } from "@boxcar/fabric";
import { createHostSandboxProvider, createWorker, type Worker, type WorkerOptions } from "@boxcar/worker";
import { type NatsFixture, natsFixture } from "./nats.js";

/** A whole Boxcar system in this process: a real nats-server, a dispatcher, a running worker and a client. */
export interface LocalSystem extends AsyncDisposable {
  readonly nats: NatsFixture;
  readonly dispatcher: Dispatcher;
  readonly worker: Worker;
  readonly client: BoxcarClient;
}

/** Starts a system whose worker runs host sandboxes unless `worker` says otherwise. */
export async function localSystem(
  opts: { topology?: TopologyOptions; worker?: Omit<Partial<WorkerOptions>, "topology"> } = {},
): Promise<LocalSystem> {
  const nats = await natsFixture(opts.topology);
  const dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  const worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()], ...opts.worker });
  void worker.run();
  return {
    nats,
    dispatcher,
    worker,
    client: createClient(nats.topology),
    async [Symbol.asyncDispose]() {
      await worker.close();
      await dispatcher.close();
      await nats[Symbol.asyncDispose]();
    },
  };
}
