import { eventually, localSystem } from "@boxcar/testing";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

/**
 * `jobs.retry` of any ended job that failed (dead, failed, timed out, cancelled), and `jobs.rerun`,
 * a new job with an ended job's spec and an edited input (docs/reliability.md#retry-and-re-run).
 */
test("a failed or cancelled job is retried, its history kept; a succeeded one is re-run as a new job with a new input, the old one left", async () => {
  await using system = await localSystem();
  const { client } = system;
  // Fails when asked to; sleeps through its first attempt when asked to.
  const script = `node -e '
    const input = JSON.parse(require("fs").readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8"));
    if (input.sleepFirst && process.env.BOXCAR_ATTEMPT === "1") setTimeout(() => {}, 60000);
    else if (input.fail) process.exit(3);
    else require("fs").writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: { doubled: input.n * 2 } }));'`;
  await client.applyAgent({ name: "doubler", command: script, trusted: true, runtime: { sandbox: "host" } });

  const { job: failing } = await client.submit({ agent: "doubler", input: { fail: true } });
  expect((await client.waitForJob(failing.id)).state).toBe("failed");
  expect((await client.retryJob(failing.id)).state).toBe("queued");
  const again = await eventually(async () => {
    const j = await client.getJob(failing.id);
    return j.state === "failed" && j.attempt === 2 ? j : undefined;
  }, "the retried attempt to fail too");
  expect(again.history.map((h) => [h.attempt, h.state])).toEqual([[1, "failed"]]); // the earlier attempt; the last is the record itself

  const { job: sleeper } = await client.submit({ agent: "doubler", input: { sleepFirst: true, n: 4 } });
  await eventually(async () => ((await client.getJob(sleeper.id)).state === "running" ? true : undefined), "the sleeper to run");
  await client.cancelJob(sleeper.id);
  expect((await client.waitForJob(sleeper.id)).state).toBe("cancelled");
  await client.retryJob(sleeper.id);
  const woke = await eventually(async () => {
    const j = await client.getJob(sleeper.id);
    return j.state === "succeeded" ? j : undefined;
  }, "the cancelled job, retried, to succeed");
  expect(woke).toMatchObject({ attempt: 2, result: { output: { doubled: 8 } } });

  const { job: first } = await client.submit({ agent: "doubler", input: { n: 2 }, labels: { team: "a" } });
  expect((await client.waitForJob(first.id)).result?.output).toEqual({ doubled: 4 });
  await expect(client.retryJob(first.id)).rejects.toMatchObject({
    code: "conflict",
    message: expect.stringContaining("re-run it instead"),
  });
  const rerun = await client.rerunJob(first.id, { n: 21 });
  expect(rerun.id).not.toBe(first.id);
  expect(rerun).toMatchObject({ rerunOf: first.id, spec: { input: { n: 21 }, labels: { team: "a" } } });
  expect((await client.waitForJob(rerun.id)).result?.output).toEqual({ doubled: 42 });
  expect((await client.getJob(first.id)).result?.output).toEqual({ doubled: 4 }); // left as it was
  // Without an input, the old one's; a job not yet ended is not re-run.
  expect((await client.rerunJob(first.id)).spec?.input).toEqual({ n: 2 });
  const { job: running } = await client.submit({ agent: "doubler", input: { sleepFirst: true } });
  await expect(client.rerunJob(running.id)).rejects.toMatchObject({ code: "conflict" });
  await client.cancelJob(running.id);
}, 90_000);

test("boxcar rerun JOB --input ... --wait runs it again with the new input; boxcar retry takes a failed job", async () => {
  await using system = await localSystem();
  const { client } = system;
  const cli = (...args: string[]) => boxcar(system.nats.url, system.nats.topology.names.prefix, args);
  await client.applyAgent({
    name: "echoer",
    command: `cp "$BOXCAR_INPUT_FILE" out.json; node -e 'const i=require("./out.json"); if (i.fail) process.exit(1); require("fs").writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({output:i}))'`,
    trusted: true,
    runtime: { sandbox: "host" },
  });
  const { job } = await client.submit({ agent: "echoer", input: { fail: true } });
  expect((await client.waitForJob(job.id)).state).toBe("failed");
  const retried = await cli("retry", job.id);
  expect(retried.stdout, retried.stderr).toContain(`${job.id} queued again`);
  const rerun = await cli("rerun", job.id, "--input", '{"said":"hi"}', "--wait", "--json");
  expect(rerun.code, rerun.stderr).toBe(0);
  expect(JSON.parse(rerun.stdout)).toMatchObject({ rerunOf: job.id, state: "succeeded", result: { output: { said: "hi" } } });
  expect((await cli("rerun")).code).toBe(2);
}, 60_000);
