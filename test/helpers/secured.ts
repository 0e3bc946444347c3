import type { AuthDir } from "@boxcar/auth";
import { type BoxcarClient, connectNats, createClient, resolveConnection } from "@boxcar/client";
import type { Logger } from "@boxcar/common";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { NatsServer } from "@boxcar/fabric";
import { type AgentDefinitionInput, type Names, names as namesOf, type Role } from "@boxcar/protocol";
import { natsFixture } from "@boxcar/testing";
import { createDockerSandboxProvider, createHostSandboxProvider, createWorker, type SandboxProvider, type Worker } from "@boxcar/worker";
import type { NatsConnection } from "@nats-io/transport-node";

/** One principal's connection and SDK client, as that user. */
export interface Principal {
  readonly user: string;
  readonly role: Role;
  readonly creds: string;
  readonly nc: NatsConnection;
  readonly names: Names;
  readonly client: BoxcarClient;
}

/**
 * A Boxcar system on a nats-server that runs the config `boxcar auth init` wrote: a dispatcher
 * with the dispatcher credential (signing work items), a host worker with the worker credential
 * (checking them), and a connection per principal.
 */
export interface SecuredSystem extends AsyncDisposable {
  readonly auth: AuthDir;
  readonly server: NatsServer;
  readonly url: string;
  readonly prefix: string;
  readonly dispatcher: Dispatcher;
  readonly worker: Worker;
  /** Connects as `user` (minting it under `role` first if it has no credential yet). */
  as(user: string, role?: Role): Promise<Principal>;
  /** Every log line the roles wrote, to check for leaks. */
  readonly logLines: string[];
}

export async function securedSystem(
  opts: {
    prefix?: string;
    server?: Parameters<typeof natsFixture>[1];
    /** The worker's sandboxes besides the host's; each made once the system's prefix and id are known. */
    providers?: (topology: { prefix: string; systemId: string }) => SandboxProvider[];
    /** How often the worker looks for what crashed workers left (default the worker's). */
    reapIntervalMs?: number;
    /** The worker's secrets allow-list, with values (its `secretsEnv`). */
    secretsEnv?: Record<string, string>;
    /** How often the dispatcher sweeps the work stream (its `givenUpIntervalMs`; default the dispatcher's). */
    sweepIntervalMs?: number;
  } = {},
): Promise<SecuredSystem> {
  const nats = await natsFixture(opts.prefix ? { prefix: opts.prefix } : {}, opts.server);
  const { auth, server } = nats;
  const prefix = nats.topology.names.prefix;
  const logLines: string[] = [];
  const logger = lineLogger(logLines);
  const principals: Principal[] = [];

  const as = async (user: string, role: Role = "submitter"): Promise<Principal> => {
    if (!auth.users().some((u) => u.name === user && !u.revokedAt)) await auth.mint(user, role);
    const creds = auth.credsFile(user);
    const connection = resolveConnection({ flags: { nats: server.url, creds }, env: {} });
    const nc = await connectNats(connection, `test-${user}`);
    const names = namesOf(prefix);
    const p = {
      user,
      role: connection.identity.role,
      creds,
      nc,
      names,
      client: createClient({ nc, names }, { identity: connection.identity }),
    };
    principals.push(p);
    return p;
  };

  const dispatcher = await startDispatcher({
    ...nats.dispatcherRole,
    logger,
    ...(opts.sweepIntervalMs !== undefined ? { givenUpIntervalMs: opts.sweepIntervalMs } : {}),
  });
  const providers = [createHostSandboxProvider(), ...(opts.providers?.({ prefix, systemId: nats.topology.systemId }) ?? [])];
  const worker = createWorker({
    ...nats.workerRole,
    logger,
    providers,
    policy: { host: "always" },
    ...(opts.reapIntervalMs !== undefined ? { reapIntervalMs: opts.reapIntervalMs } : {}),
    ...(opts.secretsEnv ? { secretsEnv: opts.secretsEnv } : {}),
  });
  void worker.run();
  return {
    auth,
    server,
    url: server.url,
    prefix,
    dispatcher,
    worker,
    as,
    logLines,
    async [Symbol.asyncDispose]() {
      await worker.close();
      await dispatcher.close();
      for (const p of principals) await p.nc.close().catch(() => {});
      await nats[Symbol.asyncDispose]();
    },
  };
}

/** A secured system's Docker sandboxes (its `providers`), made for its prefix and id. */
export const dockerSandboxes = ({ prefix, systemId }: { prefix: string; systemId: string }): SandboxProvider[] => [
  createDockerSandboxProvider({ prefix, system: systemId }),
];

/** A secured system with Docker sandboxes, and the principals the session tests act as. */
export interface DockerSessions {
  readonly system: SecuredSystem;
  /** Submitters. */
  readonly alice: Principal;
  readonly bob: Principal;
  readonly viewer: Principal;
}

/**
 * A secured system whose worker runs Docker sandboxes (`system` adds to its options), alice and
 * bob (submitters) and a viewer, and an agent `box` whose sessions run in Docker for a minute at
 * most (`box` adds to or replaces its fields), applied by an admin.
 */
export async function dockerSessions(
  opts: { system?: Omit<Parameters<typeof securedSystem>[0], "providers">; box?: Partial<AgentDefinitionInput> } = {},
): Promise<DockerSessions> {
  const system = await securedSystem({ ...opts.system, providers: dockerSandboxes });
  const alice = await system.as("alice", "submitter");
  const bob = await system.as("bob", "submitter");
  const viewer = await system.as("viewer", "viewer");
  const admin = await system.as("admin", "admin");
  await admin.client.applyAgent({
    name: "box",
    command: ["true"],
    sessions: true,
    runtime: { sandbox: "docker", timeout: "1m" },
    ...opts.box,
  });
  return { system, alice, bob, viewer };
}

/** A logger that keeps every line as JSON text. */
function lineLogger(lines: string[], bindings: Record<string, unknown> = {}): Logger {
  const write = (obj: object, msg?: string) => {
    lines.push(
      JSON.stringify({ ...bindings, ...obj, msg }, (_key, value: unknown) =>
        value instanceof Error ? { message: value.message, stack: value.stack } : value,
      ),
    );
  };
  return { debug: write, info: write, warn: write, error: write, child: (more) => lineLogger(lines, { ...bindings, ...more }) };
}
