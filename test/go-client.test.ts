import { execFile } from "node:child_process";
import { access } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { type NatsFixture, natsFixture, scratch } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import { describe, expect, test } from "vitest";

const run = promisify(execFile);
const EXAMPLE = fileURLToPath(new URL("../examples/clients/go", import.meta.url));
/** Debian's packages (golang-go, golang-github-nats-io-go-nats-dev): no module download, no network. */
const GOPATH = "/usr/share/gocode";
const goReady = await run("go", ["version"]).then(
  () => access(join(GOPATH, "src/github.com/nats-io/nats.go")).then(() => true),
  () => false,
);
if (!goReady && process.env.BOXCAR_REQUIRE_GO) throw new Error("BOXCAR_REQUIRE_GO is set, but go or Debian's nats.go is missing");

/**
 * "Any language": the Go client in examples/clients/go, written from docs/nats-api.md with
 * nats.go and no Boxcar code, built with Debian's Go and run as a submitter against a real
 * dispatcher and worker on a NATS server with authentication.
 */
describe.skipIf(!goReady)("the Go example client", () => {
  test("as a submitter it submits and follows, resubmits, reads history, is refused and cancels; as the admin it also discovers", async () => {
    await using dir = await scratch("boxcar-go-client-");
    const env = { ...process.env, GO111MODULE: "off", GOPATH, GOCACHE: join(dir.path, "cache"), GOFLAGS: "" };
    const binary = join(dir.path, "boxcar-go-client");
    await run("go", ["build", "-o", binary, "."], { cwd: EXAMPLE, env, timeout: 180_000 });

    await using nats: NatsFixture = await natsFixture();
    await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
    await using worker = createWorker({ ...nats.workerRole, providers: [createHostSandboxProvider()] });
    void worker.run();
    const admin = createClient(nats.topology);
    const host = { trusted: true, runtime: { sandbox: "host" as const } };
    await admin.applyAgent({
      name: "echo",
      command: 'printf \'{"output":%s}\' "$(cat "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"',
      ...host,
    });
    await admin.applyAgent({ name: "sleeper", command: "sleep 300", ...host });
    await nats.auth.mint("alice", "submitter");

    const { prefix } = nats.topology.names;
    /** Runs the client as `role`/`user` with that user's credential; its steps by name. */
    const runAs = async (role: string, user: string) => {
      const { stdout } = await run(
        binary,
        [
          ...["-nats", nats.url, "-creds", nats.auth.credsFile(user), "-prefix", prefix],
          ...["-role", role, "-user", user, "-agent", "echo", "-slow-agent", "sleeper"],
        ],
        { timeout: 120_000 },
      );
      const lines = stdout.trim().split("\n");
      return Object.fromEntries(lines.map((line) => JSON.parse(line) as Record<string, unknown>).map((s) => [s.step, s]));
    };

    const steps = await runAs("submitter", "alice");
    expect(steps.discover).toBeUndefined(); // a submitter may not publish on $SRV subjects
    expect(steps.submit).toMatchObject({ owner: "alice", state: "succeeded", output: { from: "go" } });
    expect(steps.submit.events).toEqual(expect.arrayContaining(["queued", "started", "succeeded"]));
    expect(steps.resubmit).toEqual({ step: "resubmit", sameJob: true, duplicate: true });
    expect(steps.history.events).toBeGreaterThanOrEqual(4); // accepted, queued, started, ..., succeeded, unfolded
    expect(steps.refused).toEqual({ step: "refused", code: "unknown_agent", status: "404" });
    expect(steps.cancel).toEqual({ step: "cancel", state: "cancelled" });
    // The job is alice's: the admin sees it under her name.
    expect((await admin.getJob(steps.submit.id as string)).owner).toBe("alice");

    // As the admin, it also finds the dispatchers through the services API.
    const asAdmin = await runAs("admin", "admin");
    expect(asAdmin.discover).toMatchObject({ service: `${prefix}-dispatcher`, submit: `${prefix}.api.*.*.jobs.submit` });
    expect(asAdmin.discover?.endpoints).toBeGreaterThan(10);
    expect(asAdmin.submit).toMatchObject({ owner: "admin", state: "succeeded", output: { from: "go" } });
    expect(asAdmin.cancel).toEqual({ step: "cancel", state: "cancelled" });
  }, 240_000);
});
