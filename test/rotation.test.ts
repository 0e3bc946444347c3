import { copyFile, readFile } from "node:fs/promises";
import { join } from "node:path";
import { connectNats, createClient, resolveConnection } from "@boxcar/client";
import { ErrorCode } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture } from "@boxcar/testing";
import { afterAll, beforeAll, expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";

let nats: NatsFixture;
beforeAll(async () => {
  nats = await natsFixture();
});
afterAll(async () => {
  await nats?.[Symbol.asyncDispose]();
});

const hello = { name: "hello", command: 'printf \'{"output":"hi"}\' > "$BOXCAR_RESULT_FILE"', runtime: { sandbox: "host" }, trusted: true };

test("a dispatcher's key is rotated with no job lost and no worker restarted: old and new both trusted until the rotation is finished", async () => {
  const { auth, url } = nats;
  const prefix = nats.topology.names.prefix;
  const cli = (...args: string[]) => boxcar(url, prefix, args, { BOXCAR_AUTH_DIR: auth.dir });
  const runJob = async () => {
    const submitted = await cli("submit", "hello", "--wait", "--json", "--timeout", "20s");
    expect(submitted.stderr).toBe("");
    expect(JSON.parse(submitted.stdout).state).toBe("succeeded");
  };
  const dispatcherAnswers = () => eventually(async () => ((await cli("workers")).code === 0 ? true : undefined), "a dispatcher answers");
  const keysFile = join(auth.dir, "dispatchers.pub");
  const oldCreds = join(auth.dir, "old-dispatcher.creds");
  await copyFile(auth.credsFile("dispatcher"), oldCreds);

  let dispatcher = spawnBoxcar(url, prefix, ["dispatcher"]);
  // The worker re-reads its --dispatcher-keys file (the fixture gives it dispatchers.pub).
  const worker = spawnBoxcar(url, prefix, ["worker", "--host", "always"]);
  try {
    await dispatcherAnswers();
    await createClient(nats.topology).applyAgent(hello);
    await runJob();

    const started = await cli("auth", "rotate", "dispatcher");
    expect(started.code, started.stderr).toBe(0);
    expect(started.stdout).toContain("the old one works until `boxcar auth rotate dispatcher --finish`");
    expect((await readFile(keysFile, "utf8")).trim().split("\n")).toHaveLength(2);
    expect((await cli("auth", "ls")).stdout).toMatch(/dispatcher\s+dispatcher\s+retiring since/);
    await eventually(async () => (worker.output().includes("dispatcher keys reloaded") ? true : undefined), "the worker re-reads the keys");
    await runJob(); // the old dispatcher still runs, still trusted

    // Restart the dispatcher with the new credential.
    dispatcher.kill("SIGTERM");
    await exited(dispatcher);
    dispatcher = spawnBoxcar(url, prefix, ["dispatcher"]);
    await dispatcherAnswers();
    await runJob();

    const finished = await cli("auth", "rotate", "dispatcher", "--finish");
    expect(finished.code, finished.stderr).toBe(0);
    expect((await readFile(keysFile, "utf8")).trim().split("\n")).toHaveLength(1);
    await expect(connectNats(resolveConnection({ flags: { nats: url, creds: oldCreds }, env: {} }), "old")).rejects.toMatchObject({
      code: ErrorCode.unavailable,
    });
    await runJob();
    expect(worker.output()).not.toContain("work_rejected");

    const again = await cli("auth", "rotate", "dispatcher", "--finish");
    expect(again.code).toBe(3);
    expect(again.stderr).toContain("no rotation of dispatcher is under way");
  } catch (err) {
    throw new Error(`${(err as Error).message}\ndispatcher:\n${dispatcher.output()}\nworker:\n${worker.output()}`, { cause: err });
  } finally {
    dispatcher.kill("SIGTERM");
    worker.kill("SIGTERM");
    await Promise.all([exited(dispatcher), exited(worker)]);
  }
}, 90_000);
