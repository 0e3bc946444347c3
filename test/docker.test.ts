import { createHash, randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import type { AgentDefinitionInput, BoxcarEvent, JobRecord, SandboxEvent } from "@boxcar/protocol";
import { attemptOf, boxcarContainers, dockerReady, eventually, type NatsFixture, natsFixture, scratch } from "@boxcar/testing";
import { createDockerSandboxProvider, createHostSandboxProvider, createWorker, type SandboxProvider, type Worker } from "@boxcar/worker";
import Docker from "dockerode";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { exited, spawnBoxcar } from "./helpers/cli.js";

const ready = await dockerReady();
const SECRET = `s3cr3t-${randomBytes(8).toString("hex")}`;
const MAX_LOG_BYTES = 64 * 1024;

let nats: NatsFixture;
let dispatcher: Dispatcher;
let worker: Worker;
let client: BoxcarClient;
/** The worker's Docker backend: it keeps 2 warm containers for each (image, network) runtime.warm agents use. */
let docker: SandboxProvider;
const WARM = 2;

describe.skipIf(!ready)("Docker sandboxes (real engine)", () => {
  beforeAll(async () => {
    nats = await natsFixture();
    dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    docker = createDockerSandboxProvider({ prefix: nats.topology.names.prefix, system: nats.topology.systemId, warm: WARM });
    worker = createWorker({
      ...nats.workerRole,
      providers: [createHostSandboxProvider(), docker],
      concurrency: 4,
      maxLogBytes: MAX_LOG_BYTES,
      secretsEnv: { AGENT_TOKEN: SECRET },
    });
    void worker.run();
    client = createClient(nats.topology);
  });
  afterAll(async () => {
    await worker?.close();
    await dispatcher?.close();
    await nats?.[Symbol.asyncDispose]();
  });

  /** Applies a docker agent running `script` with bash, and runs one job to its end. */
  async function run(name: string, script: string, extra: Partial<AgentDefinitionInput> = {}, input: unknown = null) {
    const { runtime, ...rest } = extra;
    await client.applyAgent({
      name,
      command: ["bash", "-c", script],
      runtime: { sandbox: "docker", timeout: "60s", ...runtime },
      ...rest,
    });
    const { job } = await client.submit({ agent: name, input: input as never });
    return finish(job.id);
  }

  async function finish(jobId: string) {
    const final = await client.waitForJob(jobId);
    const events: BoxcarEvent[] = [];
    for await (const e of client.events(jobId)) events.push(e);
    let logs = "";
    for await (const chunk of client.logs(jobId)) logs += new TextDecoder().decode(chunk.data);
    return { final, events, logs, sandboxEvents: events.filter((e): e is SandboxEvent => e.kind === "sandbox") };
  }

  const stdout = (job: JobRecord) => job.result?.output as Record<string, unknown>;

  test("a job runs in a container; result and artifacts come back byte-exact; the container is removed", async () => {
    const data = randomBytes(200 * 1024);
    await using folder = await scratch("boxcar-docker-");
    const dir = folder.path;
    await writeFile(join(dir, "data.bin"), data);
    await client.applyAgent({
      name: "copy",
      command: [
        "bash",
        "-c",
        'mkdir -p out && cp data.bin out/copy.bin && printf \'{"output":{"sum":"%s","pwd":"%s"}}\' "$(sha256sum data.bin | cut -c1-64)" "$PWD" > "$BOXCAR_RESULT_FILE"',
      ],
      runtime: { sandbox: "docker" },
    });
    const { job } = await client.submit({ agent: "copy" }, { upload: [{ localPath: join(dir, "data.bin"), path: "data.bin" }] });
    const { final, sandboxEvents } = await finish(job.id);
    expect(final.state).toBe("succeeded");
    expect(final.sandbox?.kind).toBe("docker");
    expect(stdout(final)).toEqual({ sum: createHash("sha256").update(data).digest("hex"), pwd: "/workspace" });
    const copy = await nats.topology.artifacts.getBlob(`${job.id}/out/copy.bin`);
    expect(Buffer.from(copy ?? []).equals(data)).toBe(true);
    expect(sandboxEvents.map((e) => e.type)).toEqual(["creating", "ready", "exec_started", "exec_exited", "destroyed"]);
    const ready = sandboxEvents.find((e) => e.type === "ready");
    expect(ready).toMatchObject({ backend: "docker", image: "boxcar-agent:latest", network: "none", limits: { cpus: 1, pids: 256 } });
    expect(await boxcarContainers(nats.topology.names.prefix, job.id)).toEqual([]);
  });

  describe("the workspace is the job's own folder on the worker, bind-mounted: nothing is copied", () => {
    test("the container mounts it read-write at /workspace; what the agent left is read from it", async () => {
      await client.applyAgent({
        name: "bound",
        command: ["bash", "-c", 'echo kept > out/kept.txt; sleep 2; echo \'{"output":1}\' > "$BOXCAR_RESULT_FILE"'],
        runtime: { sandbox: "docker" },
      });
      const { job } = await client.submit({ agent: "bound" });
      const mounts = await eventually(async () => {
        const [container] = await boxcarContainers(nats.topology.names.prefix, job.id);
        return container?.State === "running" ? (await new Docker().getContainer(container.Id).inspect()).Mounts : undefined;
      }, "the container to run");
      const { final } = await finish(job.id);
      expect(mounts).toEqual([expect.objectContaining({ Type: "bind", Destination: "/workspace", RW: true })]);
      expect(mounts[0]?.Source).toContain(`~${final.sandbox?.id}-`);
      expect([final.state, final.result?.output]).toEqual(["succeeded", 1]);
      expect(new TextDecoder().decode((await nats.topology.artifacts.getBlob(`${job.id}/out/kept.txt`)) ?? undefined)).toBe("kept\n");
    });

    test("an agent's symlinks and named pipes do not reach the worker's own files (the attack, performed)", async () => {
      await using folder = await scratch("boxcar-host-secret-");
      const secretFile = join(folder.path, "secret.txt");
      await writeFile(secretFile, `{"output":"${SECRET}"}`);
      // The links point at the worker's file by its path on the worker's machine: inside the
      // container they lead nowhere, but a worker that followed them would read it.
      const script = `ln -s ${secretFile} "$BOXCAR_RESULT_FILE"; ln -s ${secretFile} out/leak.txt; ln -s ${folder.path} out/dir; mkfifo out/pipe; echo done`;
      const { final, events, logs } = await run("symlinker", script);
      expect(logs).toContain("done");
      expect(final.state).toBe("failed");
      expect(final.error?.message).toContain("leaves the workspace");
      expect(JSON.stringify(final)).not.toContain(SECRET);
      expect(JSON.stringify(events)).not.toContain(SECRET);
      expect(final.artifacts ?? []).toEqual([]);

      // A named pipe where the result file should be is not waited on.
      const piped = await run("piper", 'mkfifo "$BOXCAR_RESULT_FILE"; echo made');
      expect(piped.logs).toContain("made");
      expect(["succeeded", "failed"]).toContain(piped.final.state);
      expect(JSON.stringify(piped.final)).not.toContain(SECRET);
    });
    test("a workspace past its quota is caught while the agent writes it: the agent is killed, the job fails saying so", async () => {
      // A worker whose workspaces are on a disk (no memory limit bounds them there) with a 20 MiB quota.
      await using root = await scratch("boxcar-quota-root-");
      await using quota = createWorker({
        ...nats.workerRole,
        pools: ["quota"],
        providers: [
          createDockerSandboxProvider({
            prefix: nats.topology.names.prefix,
            system: nats.topology.systemId,
            workspace: "bind",
            root: root.path,
            maxWorkspaceBytes: 20 * 1024 ** 2,
          }),
        ],
      });
      void quota.run();
      const { final } = await run("filler", "head -c 100000000 /dev/zero > big; echo wrote; sleep 30", {
        pool: "quota",
        runtime: { timeout: "1m" },
      });
      expect(final.state).toBe("failed");
      expect(final.error).toMatchObject({ code: "sandbox_failed", message: expect.stringContaining("quota of 20971520 bytes") });
      const ranMs = Date.parse(final.finishedAt ?? "") - Date.parse(final.startedAt ?? "");
      expect(ranMs).toBeLessThan(15_000); // not the agent's 30 s sleep
      expect(await boxcarContainers(nats.topology.names.prefix, final.id)).toEqual([]);

      // A sparse file made as the agent ends, between two looks: the last look, when it has
      // ended, counts its length, and no artifact of it is stored.
      const sparse = await run("sparse", "truncate -s 200M out/sparse.bin; echo made", { pool: "quota" });
      expect(sparse.final.state).toBe("failed");
      expect(sparse.final.error?.message).toMatch(/quota of 20971520 bytes by the time the agent ended/);
      expect(sparse.final.artifacts ?? []).toEqual([]);
    });
  });

  test("an agent that asks for auto runs in Docker on a worker with an engine, and the events say why", async () => {
    await client.applyAgent({ name: "anywhere", command: ["bash", "-c", "echo in $PWD"] });
    const { job } = await client.submit({ agent: "anywhere" });
    const { final, events } = await finish(job.id);
    expect(final.state).toBe("succeeded");
    expect(final.sandbox).toMatchObject({ kind: "docker", reason: expect.stringMatching(/^auto: docker/) });
    const started = events.find((e) => e.kind === "job" && e.type === "started");
    expect(started).toMatchObject({ sandbox: { kind: "docker", reason: expect.stringMatching(/^auto: docker/) } });
  });

  /**
   * The escape battery, run against cold containers (made for their job) and warm ones (started
   * before it, from the worker's pool): every bound must hold the same in both.
   */
  describe.each(["cold", "warm"] as const)("the escape battery, %s containers", (mode) => {
    const warm = mode === "warm";
    beforeAll(async () => {
      // The first job of an (image, network) runs cold and has the pool fill for it: bridge here.
      if (warm) await run("warm-up-bridge", "true", { runtime: { network: "bridge", warm: true } });
    });

    /** Until the pool has its containers for both networks ready (it refills in the background). */
    async function warmPoolFull(): Promise<void> {
      if (!warm) return;
      const full = () => ["none", "bridge"].every((network) => (docker.warmReady?.({ network }) ?? 0) >= WARM);
      await eventually(async () => (full() ? true : undefined), "the warm pool to fill");
    }

    /** `run` in this mode; the run must have started as the mode says. */
    async function runIn(name: string, script: string, extra: Partial<AgentDefinitionInput> = {}) {
      await warmPoolFull();
      const result = await run(`${name}-${mode}`, script, { ...extra, runtime: { ...extra.runtime, warm } });
      expect(result.sandboxEvents.find((e) => e.type === "ready")?.start).toBe(warm ? "warm_hit" : "cold");
      return result;
    }

    describe("isolation", () => {
      let listener: Server;
      let port = 0;
      let gateway = "";
      beforeAll(async () => {
        // A server on every host address: reachable from a bridged container, so the test of the
        // unnetworked one is real.
        listener = createServer((socket) => socket.end("hello from the host\n"));
        await new Promise<void>((r) => listener.listen(0, "0.0.0.0", () => r()));
        port = (listener.address() as { port: number }).port;
        const bridge = await new Docker().getNetwork("bridge").inspect();
        gateway = bridge.IPAM?.Config?.[0]?.Gateway ?? "172.17.0.1";
      });
      afterAll(() => listener?.close());

      const probe = (host: () => string, p: () => number) =>
        `ls /sys/class/net | tr '\\n' ' ' > out.txt; echo >> out.txt
         (timeout 3 bash -c "exec 3<>/dev/tcp/${host()}/${p()} && head -1 <&3") >> out.txt 2>&1 || echo "no-host" >> out.txt
         (timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/${nats.server.port}") 2>/dev/null && echo "nats-reached" >> out.txt || echo "no-nats" >> out.txt
         (getent hosts deb.debian.org >/dev/null && echo "dns") >> out.txt || echo "no-dns" >> out.txt
         printf '{"output":%s}' "$(node -e 'console.log(JSON.stringify(require("fs").readFileSync("out.txt","utf8")))')" > "$BOXCAR_RESULT_FILE"`;

      test("without a network the agent reaches nothing: not the host, not NATS, not the internet", async () => {
        const { final } = await runIn(
          "offline",
          probe(
            () => gateway,
            () => port,
          ),
        );
        expect(final.state).toBe("succeeded");
        const out = String(final.result?.output);
        expect(out.split("\n")[0]?.trim()).toBe("lo");
        expect(out).toContain("no-host");
        expect(out).toContain("no-nats");
        expect(out).toContain("no-dns");
      });

      test("with network: bridge the same probe does reach the host (so the test above can fail)", async () => {
        const { final } = await runIn(
          "online",
          probe(
            () => gateway,
            () => port,
          ),
          { runtime: { network: "bridge" } },
        );
        expect(String(final.result?.output)).toContain("hello from the host");
      });

      test("it writes only to its workspace and /tmp, is not root and cannot become root", async () => {
        const script = `for p in /etc/x /usr/x /x /var/x /workspace/ok /tmp/ok; do touch $p 2>/dev/null && echo "wrote $p" || echo "denied $p"; done
          echo "uid=$(id -u)"; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status
          su -c id root </dev/null 2>&1 | head -1 || true
          test -S /var/run/docker.sock && echo "docker-socket" || echo "no-docker-socket"`;
        const { logs } = await runIn("confined", script);
        expect(logs).toContain("denied /etc/x");
        expect(logs).toContain("denied /usr/x");
        expect(logs).toContain("denied /x");
        expect(logs).toContain("denied /var/x");
        expect(logs).toContain("wrote /workspace/ok");
        expect(logs).toContain("wrote /tmp/ok");
        expect(logs).toContain("uid=1000");
        expect(logs).toMatch(/CapEff:\s+0000000000000000/);
        expect(logs).toMatch(/NoNewPrivs:\s+1/);
        expect(logs).toMatch(/Seccomp:\s+2/); // a seccomp filter is in force
        expect(logs).not.toMatch(/uid=0\(root\)/);
        expect(logs).toContain("no-docker-socket");
      });
    });

    describe("resource limits", () => {
      test("a fork bomb is contained by the pids limit, and the job reports it", async () => {
        // `sleep` itself may fail to fork while the bomb holds every process the limit allows (in a
        // warm container the bomb starts at once, and the job was once over in 123 ms, before its
        // usage was sampled): the agent tries again until it forks, or its timeout ends it. (Runs
        // killed 168 ms in were the lifeline's sentinel, refused a fork for a beat; it forks for
        // none now where the image has bash: lifeline.ts.)
        const { final, sandboxEvents } = await runIn(
          "forkbomb",
          "bomb() { bomb | bomb & }; bomb; until sleep 4; do :; done; echo survived",
          {
            runtime: { timeout: "8s", limits: { pids: 48 } },
          },
        );
        // Say what happened if it fails.
        const seen = JSON.stringify({
          state: final.state,
          error: final.error,
          sandbox: sandboxEvents.map((e) => [e.type, e.error?.message]),
        });
        expect(["failed", "timed_out", "succeeded"], seen).toContain(final.state);
        const exited = sandboxEvents.find((e) => e.type === "exec_exited");
        // A run shorter than the engine's first stats sample (about a second) has no usage: say why it was short.
        expect(exited?.usage, seen).toBeDefined();
        expect(exited?.usage?.pidsPeak, seen).toBeGreaterThanOrEqual(24);
        expect(exited?.usage?.pidsPeak).toBeLessThanOrEqual(48);
        expect(exited?.usage?.memoryPeakBytes).toBeGreaterThan(0);
        expect(final.result?.usage?.pidsPeak).toBe(exited?.usage?.pidsPeak);
        expect(await boxcarContainers(nats.topology.names.prefix, final.id)).toEqual([]);
      });

      test("a memory hog is OOM-killed and the job says so", async () => {
        const { final, sandboxEvents } = await runIn("hog", `node -e 'const a = []; for (;;) a.push(Buffer.alloc(1 << 20, 1))'`, {
          runtime: { limits: { memory: "64Mi" } },
        });
        expect(final.state).toBe("failed");
        expect(final.error?.code).toBe("oom_killed");
        expect(final.error?.message).toContain(String(64 * 1024 * 1024));
        expect(final.result?.oomKilled).toBe(true);
        expect(sandboxEvents.find((e) => e.type === "exec_exited")).toMatchObject({ oomKilled: true, signal: "SIGKILL" });
      });

      test("an output flood is capped", async () => {
        const { final, logs } = await runIn("flood", "head -c 20000000 /dev/zero | tr '\\0' 'x'; echo done");
        expect(final.state).toBe("succeeded");
        expect(logs.length).toBeLessThan(MAX_LOG_BYTES + 1024);
        expect(logs).toContain("[boxcar: output truncated after");
      });
    });

    describe("ending early", () => {
      test("a timeout kills and removes the container", async () => {
        const { final } = await runIn("sleeper", "sleep 300", { runtime: { timeout: "2s" } });
        expect(final.state).toBe("timed_out");
        expect(await boxcarContainers(nats.topology.names.prefix, final.id)).toEqual([]);
      });

      test("a cancel kills and removes the container", async () => {
        await warmPoolFull();
        await client.applyAgent({
          name: `waiter-${mode}`,
          command: ["bash", "-c", "echo up; sleep 300"],
          runtime: { sandbox: "docker", warm },
        });
        const { job } = await client.submit({ agent: `waiter-${mode}` });
        await eventually(
          async () => ((await boxcarContainers(nats.topology.names.prefix, job.id)).some((c) => c.State === "running") ? true : undefined),
          "the container to run",
        );
        await client.cancelJob(job.id);
        const { final, events } = await finish(job.id);
        expect(final.state).toBe("cancelled");
        expect(events.find((e) => e.kind === "sandbox" && e.type === "ready")).toMatchObject({ start: warm ? "warm_hit" : "cold" });
        expect(await boxcarContainers(nats.topology.names.prefix, job.id)).toEqual([]);
      });
    });

    test("secrets reach the agent but never events, logs or the record", async () => {
      const { final, events, logs } = await runIn(
        "secretive",
        'echo "working"; printf \'{"output":"%s"}\' "$(printf %s "$TOKEN" | sha256sum | cut -c1-64)" > "$BOXCAR_RESULT_FILE"',
        {
          secrets: [{ name: "TOKEN", from: "AGENT_TOKEN" }],
        },
      );
      expect(final.result?.output).toBe(createHash("sha256").update(SECRET).digest("hex"));
      expect(JSON.stringify(events)).not.toContain(SECRET);
      expect(logs).not.toContain(SECRET);
      expect(JSON.stringify(final)).not.toContain(SECRET);
    });
  });

  describe("a stop while the workspace is copied out is a stop (the escape battery found it was not)", () => {
    // 800 MB of sparse files, made at once: copying them out of the container takes seconds
    // (7 s for 900 MB through the engine here), the longer the busier the machine. The battery
    // found it with 30 000 empty files, which a workspace in memory now copies in under a second.
    const BIG_WORKSPACE = "for i in 1 2 3 4 5 6 7 8; do truncate -s 100M big$i; done";
    // This worker bind-mounts workspaces (nothing to copy); one that copies serves pool `copy`,
    // as a worker in a container does.
    let copier: Worker;
    beforeAll(() => {
      copier = createWorker({
        ...nats.workerRole,
        pools: ["copy"],
        usageReadMs: 300,
        providers: [createDockerSandboxProvider({ prefix: nats.topology.names.prefix, system: nats.topology.systemId, workspace: "copy" })],
      });
      void copier.run();
    });
    afterAll(() => copier?.close());

    test("while the agent runs with its workspace copied into the container, its usage is read and its signals written there", async () => {
      await client.applyAgent({
        name: "copied-live",
        pool: "copy",
        // A call reported at once; then it waits for a signal, and returns what it got.
        command: [
          "bash",
          "-c",
          'boxcar-usage --model m --in 5 --cost 0.5; for i in $(seq 200); do f=$(ls "$BOXCAR_SIGNALS_DIR" 2>/dev/null | head -1); [ -n "$f" ] && break; sleep 0.1; done; printf \'{"output":%s}\' "$(cat "$BOXCAR_SIGNALS_DIR/$f")" > "$BOXCAR_RESULT_FILE"',
        ],
        runtime: { sandbox: "docker", timeout: "60s" },
      });
      const { job } = await client.submit({ agent: "copied-live" });
      // Summed while it still waits for its signal: read from the container, not the staged folder.
      await eventually(
        async () => ((await client.getUsage()).agents["copied-live"]?.calls === 1 ? true : undefined),
        "its call summed",
        30_000,
      );
      expect(await client.getJob(job.id)).toMatchObject({ state: "running" });
      const sent = await client.signalJob(job.id, "go", { n: 7 });
      expect(sent.file).toBe(".boxcar/signals/0001-go.json");
      const final = await client.waitForJob(job.id);
      expect(final).toMatchObject({ state: "succeeded", usage: { calls: 1, tokensIn: 5, cost: 0.5 } });
      expect(stdout(final)).toMatchObject({ name: "go", payload: { n: 7 } });
      expect((await client.getUsage()).agents["copied-live"]).toMatchObject({ calls: 1, cost: 0.5 });
    });

    test("a timeout ends the job timed_out at once, not succeeded after the copy", async () => {
      // The agent ends on its own (exit 0) 3 s before the worker's stop, whenever that is on this
      // machine's clock: the stop comes while its files are copied out.
      const exitBeforeStop = `${BIG_WORKSPACE} && ms=$(( BOXCAR_STOP_AT - $(date +%s%3N) - 3000 )) && sleep "$(( ms / 1000 )).$(printf %03d $(( ms % 1000 )))"`;
      const { final, sandboxEvents } = await run("big-workspace-timeout", exitBeforeStop, { pool: "copy", runtime: { timeout: "8s" } });
      expect(final.state).toBe("timed_out");
      const ranMs = Date.parse(final.finishedAt ?? "") - Date.parse(final.startedAt ?? "");
      expect(ranMs).toBeLessThan(8_000 + 5_000);
      // The agent had ended on its own: the timeout came during the copy.
      expect(sandboxEvents.find((e) => e.type === "exec_exited")).toMatchObject({ exitCode: 0, signal: null });
      expect(await boxcarContainers(nats.topology.names.prefix, final.id)).toEqual([]);
    });

    test("a cancel after the agent exited, during the copy, ends the job cancelled at once", async () => {
      await client.applyAgent({
        name: "big-workspace-cancel",
        pool: "copy",
        command: ["bash", "-c", BIG_WORKSPACE],
        runtime: { sandbox: "docker" },
      });
      const { job } = await client.submit({ agent: "big-workspace-cancel" });
      // The agent has exited, and the job still runs: its workspace is being copied out.
      await eventually(
        async () => {
          const [container] = await boxcarContainers(nats.topology.names.prefix, job.id);
          return container?.State === "exited" ? true : undefined;
        },
        "the agent's container to exit",
        30_000,
      );
      expect((await client.getJob(job.id)).state).toBe("running");
      const cancelledAt = Date.now();
      await client.cancelJob(job.id);
      const final = await client.waitForJob(job.id);
      expect(final.state).toBe("cancelled");
      expect(Date.parse(final.finishedAt ?? "") - cancelledAt).toBeLessThan(5_000);
    });
  });

  test("an image is looked up once, and again when the engine no longer has it", async () => {
    const engine = new Docker();
    const tag = `boxcar-agent:gone-${randomBytes(4).toString("hex")}`;
    const [repo, version] = tag.split(":") as [string, string];
    await engine.getImage("boxcar-agent:latest").tag({ repo, tag: version });
    const first = await run("fleeting", "echo ran", { runtime: { image: tag } });
    expect(first.final.state).toBe("succeeded");
    await engine.getImage(tag).remove(); // only the tag goes
    // The worker remembered the image; the engine's refusal has it look again, and the pull
    // (no registry here) fails as a missing image does, not as a broken sandbox.
    const second = await run("fleeting", "echo ran", { runtime: { image: tag } });
    expect(second.final.state).toBe("failed");
    expect(second.final.error).toMatchObject({ code: "image_unavailable", message: expect.stringContaining(tag) });
  });

  describe("bad runtime wishes fail clearly before anything starts", () => {
    test.each([
      ["a missing image", { image: "boxcar-missing:nope" }, "image_unavailable", "boxcar-missing:nope"],
      ["too many CPUs", { limits: { cpus: 64 } }, "invalid", "cpus"],
      ["an unknown network", { network: "no-such-net" }, "invalid", "no-such-net"],
      ["the host network", { network: "host" }, "invalid", "not allowed"],
    ])("%s", async (_what, runtime, code, mentions) => {
      const { final, sandboxEvents } = await run(`bad-${code}-${mentions.replace(/[^a-z]/g, "")}`, "echo should-not-run", { runtime });
      expect(final.state).toBe("failed");
      expect(final.error?.code).toBe(code);
      expect(final.error?.message).toContain(mentions);
      expect(sandboxEvents.map((e) => e.type)).toEqual(["creating", "failed"]);
      expect(await boxcarContainers(nats.topology.names.prefix, final.id)).toEqual([]);
    });
  });

  test("a worker of another system on the same engine, with the same prefix, leaves this system's containers alone", async () => {
    await client.applyAgent({
      name: "neighbour",
      command: ["bash", "-c", 'sleep 3; printf \'{"output":"done"}\' > "$BOXCAR_RESULT_FILE"'],
      runtime: { sandbox: "docker" },
    });
    const { job } = await client.submit({ agent: "neighbour" });
    await eventually(
      async () => ((await boxcarContainers(nats.topology.names.prefix, job.id)).some((c) => c.State === "running") ? true : undefined),
      "the container to run",
    );
    // Another system (its own NATS) with this one's prefix: none of this system's workers is in
    // its presence list, so before containers carried their system, its reaper took ours for orphans.
    await using other = await natsFixture({ prefix: nats.topology.names.prefix });
    expect(other.topology.systemId).not.toBe(nats.topology.systemId);
    await using neighbour = createWorker({ ...other.workerRole, pools: ["elsewhere"], reapIntervalMs: 200 });
    void neighbour.run();
    await eventually(async () => (neighbour.accepting ? true : undefined), "the other system's worker to start");
    await new Promise((r) => setTimeout(r, 1_000)); // several of its sweeps
    const [container] = await boxcarContainers(nats.topology.names.prefix, job.id);
    expect(container?.Labels["boxcar.system"]).toBe(nats.topology.systemId);
    const final = await client.waitForJob(job.id);
    expect([final.state, final.result?.output]).toEqual(["succeeded", "done"]);
  });

  /** Freezes `frozen` (SIGSTOP) and starts another worker of `system`, whose reaper waits an hour: only a new attempt's own cleanup can remove what the frozen one left. */
  function freezeForAttemptTwo(frozen: ReturnType<typeof spawnBoxcar>, system: NatsFixture): Worker {
    frozen.kill("SIGSTOP");
    const next = createWorker({ ...system.workerRole, reapIntervalMs: 3_600_000 });
    void next.run();
    return next;
  }

  /** The job's containers once attempt 2's runs. */
  function attemptTwoRunning(prefix: string, jobId: string): Promise<Docker.ContainerInfo[]> {
    return eventually(
      async () => {
        const found = await boxcarContainers(prefix, jobId);
        return found.some((c) => attemptOf(c) === "2" && c.State === "running") ? found : undefined;
      },
      "attempt 2's container to run",
      30_000,
    );
  }

  test("a new attempt removes the container its frozen worker left running before it starts its own", async () => {
    // A system of its own with a 2 s lease, so the work item comes back soon after its worker freezes.
    await using fast = await natsFixture({ ackWaitMs: 2_000 });
    await fast.topology.ensurePoolConsumer("default");
    const fastDispatcher = await startDispatcher({ ...fast.dispatcherRole });
    const fastClient = createClient(fast.topology);
    const prefix = fast.topology.names.prefix;
    const frozen = spawnBoxcar(fast.url, prefix, ["worker"]);
    try {
      await fastClient.applyAgent({ name: "long", command: ["bash", "-c", "sleep 300"], runtime: { sandbox: "docker" } });
      const { job } = await fastClient.submit({ agent: "long" });
      await eventually(
        async () => ((await boxcarContainers(prefix, job.id)).some((c) => c.State === "running") ? true : undefined),
        "attempt 1's container to run",
      );
      // Frozen, it renews neither its lease nor its presence, and its container runs on. Its
      // presence still looks live for a while, and the next worker's reaper waits an hour.
      await using _next = freezeForAttemptTwo(frozen, fast);
      const containers = await attemptTwoRunning(prefix, job.id);
      expect(containers.map((c) => c.Labels["boxcar.attempt"])).toEqual(["2"]);
      await fastClient.cancelJob(job.id);
      expect((await fastClient.waitForJob(job.id)).state).toBe("cancelled");
    } finally {
      frozen.kill("SIGKILL");
      await exited(frozen);
      await fastDispatcher.close();
    }
  });

  test("a warm container's configuration holds nothing of its job: neither its command nor its secrets", async () => {
    await eventually(async () => ((docker.warmReady?.({ network: "none" }) ?? 0) >= WARM ? true : undefined), "the warm pool to fill");
    await client.applyAgent({
      name: "warm-secretive",
      command: ["bash", "-c", "echo up; sleep 300"],
      runtime: { sandbox: "docker", warm: true },
      secrets: [{ name: "TOKEN", from: "AGENT_TOKEN" }],
    });
    const { job } = await client.submit({ agent: "warm-secretive" });
    const [container] = await eventually(async () => {
      const found = await boxcarContainers(nats.topology.names.prefix, job.id);
      return found.length > 0 ? found : undefined;
    }, "the job to take a warm container");
    const inspected = await new Docker().getContainer(container?.Id ?? "").inspect();
    expect(inspected.Config.Labels["boxcar.warm"]).toBe("1");
    expect(JSON.stringify(inspected)).not.toContain(SECRET);
    expect(JSON.stringify(inspected)).not.toContain("sleep 300");
    await client.cancelJob(job.id);
    expect((await client.waitForJob(job.id)).state).toBe("cancelled");
  });

  test("a warm container taken by a job that ends before its agent starts is removed all the same", async () => {
    await eventually(async () => ((docker.warmReady?.({ network: "none" }) ?? 0) >= WARM ? true : undefined), "the warm pool to fill");
    const spec = { id: "sbx-never-run", jobId: "0neverstarted", attempt: 1, workerId: "w-test" };
    const runtime = { sandbox: "docker" as const, network: "none", timeout: 60_000, limits: {}, warm: true };
    const sandbox = await docker.create({ ...spec, runtime });
    expect(sandbox.description?.start).toBe("warm_hit");
    expect(await boxcarContainers(nats.topology.names.prefix, spec.jobId)).toHaveLength(1);
    await sandbox.destroy();
    expect(await boxcarContainers(nats.topology.names.prefix, spec.jobId)).toEqual([]);
  });

  test("a warm agent that forges its report (the attack, performed) is stopped before its results are read", async () => {
    // The agent reads the report's nonce from its parent shell's memory, makes reading its
    // artifacts take a while, forges "exit 0", and has a child write the result file 100 ms
    // later. The worker must kill the container on the report and read nothing it wrote after.
    const attack = `
import os, re, sys, time
maps = open(f"/proc/{os.getppid()}/maps").read().splitlines()
mem = open(f"/proc/{os.getppid()}/mem", "rb", 0)
nonce = None
for line in maps:
    addr, perms = line.split()[:2]
    if "r" not in perms: continue
    a, b = (int(x, 16) for x in addr.split("-"))
    try:
        mem.seek(a); found = re.search(rb"boxcar-exit-[0-9a-f]{24}", mem.read(b - a))
    except Exception: continue
    if found: nonce = found.group().decode(); break
print(f"found nonce: {nonce}", flush=True)
for i in range(500): open(f"out/f{i}.txt", "w").write("x")
if os.fork() == 0:
    time.sleep(0.1)
    open(os.environ["BOXCAR_RESULT_FILE"], "w").write('{"output":"written after the report"}')
    os._exit(0)
report = f"\\x1e{nonce} 0\\n"
sys.stdout.write(report); sys.stdout.flush(); sys.stderr.write(report); sys.stderr.flush()
time.sleep(10)
`;
    await eventually(async () => ((docker.warmReady?.({ network: "none" }) ?? 0) >= WARM ? true : undefined), "the warm pool to fill");
    await client.applyAgent({
      name: "forger",
      command: ["python3", "-c", attack],
      runtime: { sandbox: "docker", warm: true, timeout: "1m" },
    });
    const { job } = await client.submit({ agent: "forger" });
    const { final, logs, sandboxEvents } = await finish(job.id);
    expect(sandboxEvents.find((e) => e.type === "ready")?.start).toBe("warm_hit");
    expect(logs).toMatch(/found nonce: boxcar-exit-[0-9a-f]{24}/);
    expect(final.artifacts?.length).toBe(500);
    expect(final.result?.output).not.toBe("written after the report");
    expect(Date.parse(final.finishedAt ?? "") - Date.parse(final.startedAt ?? "")).toBeLessThan(9_000); // not the 10 s sleep
  });

  test("a frozen worker's warm containers: its job's is removed as a new attempt starts, its ready ones by a reaper once it is gone", async () => {
    await using fast = await natsFixture({ ackWaitMs: 2_000 });
    await fast.topology.ensurePoolConsumer("default");
    const fastDispatcher = await startDispatcher({ ...fast.dispatcherRole });
    const fastClient = createClient(fast.topology);
    const prefix = fast.topology.names.prefix;
    await using folder = await scratch("boxcar-warm-config-");
    const config = join(folder.path, "worker.yaml");
    await writeFile(config, "sandbox:\n  docker:\n    warm: 2\n");
    // Frozen just after its pool refills, its last presence may be an idle one: given an idle
    // heartbeat of 5 s, it counts as gone 15 s after, as a busy one would.
    const frozen = spawnBoxcar(fast.url, prefix, ["worker", "--config", config, "--idle-heartbeat", "5s"]);
    const untaken = async () => (await boxcarContainers(prefix)).filter((c) => c.Labels["boxcar.warm"] && !attemptOf(c));
    const ready = async () => (await untaken()).filter((c) => c.State === "running");
    try {
      await eventually(async () => ((await ready()).length === 2 ? true : undefined), "the worker's warm pool to fill");
      await new Promise((r) => setTimeout(r, 500)); // the worker holds a container once the engine has answered its start

      await fastClient.applyAgent({ name: "long", command: ["bash", "-c", "sleep 300"], runtime: { sandbox: "docker", warm: true } });
      const { job } = await fastClient.submit({ agent: "long" });
      const [taken] = await eventually(async () => {
        const found = await boxcarContainers(prefix, job.id);
        return found.length > 0 ? found : undefined;
      }, "attempt 1 to take a warm container");
      expect([taken?.Labels["boxcar.warm"], attemptOf(taken as Docker.ContainerInfo)]).toEqual(["1", "1"]);
      await eventually(async () => ((await ready()).length === 2 ? true : undefined), "the pool to refill");
      // Frozen, it renews neither its lease nor its presence; its containers run on.
      await using _next = freezeForAttemptTwo(frozen, fast);
      const containers = await attemptTwoRunning(prefix, job.id);
      expect(containers.map(attemptOf)).toEqual(["2"]); // attempt 1's warm container is gone
      expect(await ready()).toHaveLength(2); // its worker may still be alive: its ready ones stay
      await fastClient.cancelJob(job.id);
      expect((await fastClient.waitForJob(job.id)).state).toBe("cancelled");

      // Killed, its ready containers stop at once (their stdin, the worker's, closes) and are
      // removed by a reaper once the worker's presence says it is gone.
      frozen.kill("SIGKILL");
      await exited(frozen);
      await eventually(async () => ((await ready()).length === 0 ? true : undefined), "the killed worker's warm containers to stop");
      expect(await untaken()).toHaveLength(2);
      await using reaper = createWorker({ ...fast.workerRole, pools: ["elsewhere"], reapIntervalMs: 500 });
      void reaper.run();
      await eventually(async () => ((await untaken()).length === 0 ? true : undefined), "the reaper to remove them", 30_000);
    } finally {
      frozen.kill("SIGKILL");
      await exited(frozen);
      await fastDispatcher.close();
    }
  });

  test("a worker killed with SIGKILL leaves a container that the next worker's reaper removes", async () => {
    await client.applyAgent({ name: "orphan", command: ["bash", "-c", "sleep 300"], runtime: { sandbox: "docker" }, pool: "orphans" });
    const doomed = spawnBoxcar(nats.url, nats.topology.names.prefix, ["worker", "--pool", "orphans", "--heartbeat", "300ms"]);
    const { job } = await client.submit({ agent: "orphan" });
    await eventually(
      async () => ((await boxcarContainers(nats.topology.names.prefix, job.id)).some((c) => c.State === "running") ? true : undefined),
      "the container to run",
    );
    doomed.kill("SIGKILL");
    await exited(doomed);
    expect(await boxcarContainers(nats.topology.names.prefix, job.id)).toHaveLength(1);

    await using reaper = createWorker({ ...nats.workerRole, pools: ["elsewhere"], reapIntervalMs: 200 });
    void reaper.run();
    await eventually(
      async () => ((await boxcarContainers(nats.topology.names.prefix, job.id)).length === 0 ? true : undefined),
      "the reaper to remove the container",
    );
  });
});
