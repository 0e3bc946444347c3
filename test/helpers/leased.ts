import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import { type NatsFixture, natsFixture } from "@boxcar/testing";

/** A system whose pool `default` has a short lease (ack wait), for tests of crashed and frozen workers. */
export interface LeasedSystem extends AsyncDisposable {
  readonly nats: NatsFixture;
  readonly prefix: string;
  readonly dispatcher: Dispatcher;
  readonly client: BoxcarClient;
}

/**
 * A nats-server and a dispatcher, with the pool's consumer made here with a lease of `leaseMs`
 * (workers read it from the consumer), so redelivery after a crash comes quickly.
 */
export async function leasedSystem(leaseMs: number): Promise<LeasedSystem> {
  const nats = await natsFixture({ ackWaitMs: leaseMs });
  await nats.topology.ensurePoolConsumer("default");
  const dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  return {
    nats,
    prefix: nats.topology.names.prefix,
    dispatcher,
    client: createClient(nats.topology),
    [Symbol.asyncDispose]: async () => {
      await dispatcher.close();
      await nats[Symbol.asyncDispose]();
    },
  };
}
