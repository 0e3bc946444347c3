import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import type { BoxcarEvent } from "@boxcar/protocol";
import { boxcarContainers, dockerReady, eventually, type NatsFixture, natsFixture, scratch } from "@boxcar/testing";
import Docker from "dockerode";
import { GenericContainer, Network, type StartedNetwork, type StartedTestContainer, Wait } from "testcontainers";
import { afterAll, beforeAll, describe, expect, test } from "vitest";

// The reaper image testcontainers would start cannot be pulled here (no registry).
process.env.TESTCONTAINERS_RYUK_DISABLED ??= "true";
const WORKER_IMAGE = process.env.BOXCAR_WORKER_IMAGE ?? "boxcar-worker:latest";
const ready = await dockerReady(WORKER_IMAGE);

/**
 * `boxcar worker` in a container of the worker image, with the engine's socket and the test
 * system's credentials mounted, serving `pool`; `place` puts it on a network (default the host's,
 * to reach the test's nats-server on 127.0.0.1) and adds its own mounts and flags.
 */
function startWorkerContainer(
  nats: NatsFixture,
  pool: string,
  place: { natsUrl?: string; network?: StartedNetwork; mounts?: { source: string; target: string }[]; flags?: string[] } = {},
): Promise<StartedTestContainer> {
  // As root, as deploy/compose runs it: the image's own user (10001) can read neither the auth
  // folder's owner-only files nor the engine's socket without its group.
  const container = new GenericContainer(WORKER_IMAGE).withUser("0:0");
  return (place.network ? container.withNetwork(place.network) : container.withNetworkMode("host"))
    .withBindMounts([
      { source: "/var/run/docker.sock", target: "/var/run/docker.sock" },
      { source: nats.auth.dir, target: "/auth", mode: "ro" },
      ...(place.mounts ?? []),
    ])
    .withCommand([
      "worker",
      ...["--nats", place.natsUrl ?? nats.url, "--creds", "/auth/worker.creds", "--dispatcher-keys", "/auth/dispatchers.pub"],
      ...["--prefix", nats.topology.names.prefix, "--pool", pool, "--log-format", "json"],
      ...(place.flags ?? []),
    ])
    .withWaitStrategy(Wait.forLogMessage(/worker started/))
    .withStartupTimeout(30_000)
    .start();
}

/**
 * The "sibling containers" set-up: the worker runs in a container and starts job containers on
 * the same engine through its mounted socket. No host path is bind-mounted into job containers
 * (workspaces are copied in and out as tar streams), so nothing depends on paths inside the
 * worker's container.
 */
describe.skipIf(!ready)("a worker in a container (sibling containers)", () => {
  let nats: NatsFixture;
  let worker: StartedTestContainer;

  beforeAll(async () => {
    nats = await natsFixture();
    worker = await startWorkerContainer(nats, "sibling");
  });
  afterAll(async () => {
    await worker?.stop({ timeout: 10_000 });
    await nats?.[Symbol.asyncDispose]();
  });

  test("runs a Docker job next to itself, with the workspace copied in and out", async () => {
    await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    const client = createClient(nats.topology);
    await client.applyAgent({
      name: "sibling",
      pool: "sibling",
      // Also says what its /workspace is mounted from (the fourth field of its mount line).
      command: [
        "bash",
        "-c",
        'mkdir -p out && cat "$BOXCAR_INPUT_FILE" > out/echo.json && printf \'{"output":"%s"}\' "$(awk \'$5 == "/workspace" {print $4}\' /proc/self/mountinfo)" > "$BOXCAR_RESULT_FILE"',
      ],
      runtime: { sandbox: "docker" },
    });
    const workers = await client.listWorkers();
    expect(workers.map((w) => w.sandboxes)).toEqual([["host", "docker"]]);

    const { job } = await client.submit({ agent: "sibling", input: { from: "outside" } });
    const final = await client.waitForJob(job.id);
    expect(final.state).toBe("succeeded");
    expect(final.sandbox?.kind).toBe("docker");
    expect(final.workerId).toBe(workers[0]?.id);
    // A worker in a container copies workspaces: an anonymous volume of the engine's, not a
    // folder of the worker's (with --network host it has the host's name, is not found on the
    // engine, and learns so from the engine's refusal of its first bind mount).
    expect(final.result?.output).toMatch(/^\/var\/lib\/docker\/volumes\/[0-9a-f]{64}\/_data$/);
    const echoed = await nats.topology.artifacts.getBlob(`${job.id}/out/echo.json`);
    expect(JSON.parse(new TextDecoder().decode(echoed ?? new Uint8Array()))).toEqual({ from: "outside" });
    expect(await boxcarContainers(nats.topology.names.prefix, job.id)).toEqual([]);
  });

  test("stops cleanly on SIGTERM (exit 0), removing its presence", async () => {
    await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    await worker.stop({ timeout: 10_000, remove: false });
    const container = new Docker().getContainer(worker.getId());
    expect((await container.inspect()).State.ExitCode).toBe(0);
    await container.remove();
    expect(await createClient(nats.topology).listWorkers()).toEqual([]);
  });
});

describe.skipIf(!ready)("a worker in a container that shares its work root with the engine's machine", () => {
  test("bind-mounts workspaces by their shared path, nothing copied, and keeps a warm pool", async () => {
    await using nats = await natsFixture();
    // The folder at the same path inside the worker's container as on the engine's machine.
    await using shared = await scratch("boxcar-shared-root-");
    const worker = await startWorkerContainer(nats, "shared", {
      mounts: [{ source: shared.path, target: shared.path }],
      flags: ["--work-root", shared.path, "--docker-warm", "1"],
    });
    try {
      await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
      const client = createClient(nats.topology);
      await client.applyAgent({
        name: "shared",
        pool: "shared",
        command: [
          "bash",
          "-c",
          'printf \'{"output":"%s"}\' "$(awk \'$5 == "/workspace" {print $4}\' /proc/self/mountinfo)" > "$BOXCAR_RESULT_FILE"',
        ],
        runtime: { sandbox: "docker", warm: true },
      });
      await eventually(async () => ((await client.listWorkers())[0]?.warm === 1 ? true : undefined), "the warm pool to fill", 30_000);
      const { job } = await client.submit({ agent: "shared" });
      const final = await client.waitForJob(job.id);
      expect(final.state).toBe("succeeded");
      // Its /workspace is a folder under the shared root, not an engine volume.
      expect(String(final.result?.output)).toMatch(new RegExp(`^${shared.path}/boxcar-[^~/]+~[^~/]+~warm-`));
      const events: BoxcarEvent[] = [];
      for await (const e of client.events(job.id)) events.push(e);
      expect(events.find((e) => e.kind === "sandbox" && e.type === "ready")).toMatchObject({ start: "warm_hit" });
    } finally {
      await worker.stop({ timeout: 10_000 });
    }
  });
});

describe.skipIf(!ready)("a worker in a container on a network of its own", () => {
  test("never puts an agent on the worker's own network (the one NATS and the roles use)", async () => {
    await using nats = await natsFixture({}, { host: "0.0.0.0" });
    const network = await new Network().start();
    const info = await new Docker().getNetwork(network.getName()).inspect();
    const gateway = info.IPAM?.Config?.[0]?.Gateway as string;
    const port = new URL(nats.url).port;
    const worker = await startWorkerContainer(nats, "own-net", { network, natsUrl: `nats://${gateway}:${port}` });
    try {
      await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
      const client = createClient(nats.topology);
      await client.applyAgent({
        name: "sneaky",
        pool: "own-net",
        command: ["true"],
        runtime: { sandbox: "docker", network: network.getName() },
      });
      const { job } = await client.submit({ agent: "sneaky" });
      const final = await client.waitForJob(job.id);
      expect(final.state).toBe("failed");
      expect(final.error?.message).toContain(`runtime.network ${network.getName()} is not allowed: the worker itself is on it`);
      expect(await boxcarContainers(nats.topology.names.prefix, job.id)).toEqual([]);
    } finally {
      await worker.stop({ timeout: 10_000 });
      await network.stop();
    }
  }, 90_000);
});
