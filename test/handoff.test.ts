import type { BoxcarClient } from "@boxcar/client";
import { type BoxcarEvent, ErrorCode, type JobRecord } from "@boxcar/protocol";
import { type LocalSystem, localSystem } from "@boxcar/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

let system: LocalSystem;
let client: BoxcarClient;

beforeAll(async () => {
  system = await localSystem({ worker: { concurrency: 4 } });
  client = system.client;
});
afterAll(async () => {
  await system?.[Symbol.asyncDispose]();
});

/** A trusted host agent whose command is a Node.js script (the worker's own node). */
async function agent(name: string, script: string, handoffs: string[] = []) {
  await client.applyAgent({
    name,
    command: ["node", "-e", script],
    trusted: true,
    runtime: { sandbox: "host", timeout: "30s" },
    handoffs,
  });
}

/** Script prelude: reads the input and the chain, and `done(result)` writes the result file. */
const PRELUDE = `
const fs = require("node:fs");
const input = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8"));
const chain = JSON.parse(fs.readFileSync(process.env.BOXCAR_CHAIN_FILE, "utf8"));
const done = (r) => fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify(r));
`;

async function chainEvents(rootId: string): Promise<BoxcarEvent[]> {
  const events: BoxcarEvent[] = [];
  for await (const e of client.events(rootId, { chain: true, follow: true })) events.push(e);
  return events;
}

describe("dynamic handoffs", () => {
  test("a three-step chain passes its files byte-exact, links each job to the last, and shows the history", async () => {
    await agent(
      "hf-make",
      `${PRELUDE}
      fs.mkdirSync("out/data", { recursive: true });
      fs.writeFileSync("out/data/blob.bin", require("node:crypto").randomBytes(300000));
      done({ summary: "made a blob", handoff: { to: "hf-pass", input: { note: "check it" } } });`,
      ["hf-pass"],
    );
    await agent(
      "hf-pass",
      `${PRELUDE}
      if (!fs.existsSync("out/data/blob.bin")) { console.error("no blob"); process.exit(4); }
      done({ summary: "passed " + input.note, handoff: { to: "hf-check", input: { from: chain.history.map((h) => h.agent) } } });`,
      ["hf-check"],
    );
    await agent(
      "hf-check",
      `${PRELUDE}
      const sha = require("node:crypto").createHash("sha256").update(fs.readFileSync("out/data/blob.bin")).digest("hex");
      done({ output: { sha, input, chain }, summary: "checked" });`,
    );

    const { job: root } = await client.submit({ agent: "hf-make" });
    const last = await client.waitForChain(root.id);
    expect(last).toMatchObject({ agent: "hf-check", state: "succeeded" });

    const first = await client.getJob(root.id);
    const second = await client.getJob(first.handoff?.jobId as string);
    expect(first.handoff).toEqual({ to: "hf-pass", jobId: second.id });
    expect(second.handoff).toEqual({ to: "hf-check", jobId: last.id });
    expect(second.chain).toMatchObject({ root: root.id, parent: root.id, depth: 1 });
    expect(last.chain).toMatchObject({ root: root.id, parent: second.id, depth: 2 });

    const made = first.artifacts.find((a) => a.path === "out/data/blob.bin");
    const output = last.result?.output as { sha: string; input: unknown; chain: { history: unknown[]; depth: number } };
    expect(made?.size).toBe(300000);
    expect(output.sha).toBe(made?.sha256);
    // The file went through the middle job unchanged, and was kept by each job as its own artifact.
    expect(second.artifacts.find((a) => a.path === "out/data/blob.bin")?.sha256).toBe(made?.sha256);
    expect(output.input).toEqual({ from: ["hf-make"] });
    expect(output.chain).toMatchObject({
      root: root.id,
      depth: 2,
      history: [
        { jobId: root.id, agent: "hf-make", summary: "made a blob" },
        { jobId: second.id, agent: "hf-pass", summary: "passed check it" },
      ],
    });

    // Following the first job's events follows the chain, job after job.
    const events = (await chainEvents(root.id)).filter((e) => e.kind === "job");
    const trail = events.map((e) => `${e.agent}:${e.type}`).filter((t) => !t.endsWith(":progress"));
    expect(trail).toEqual([
      "hf-make:accepted",
      "hf-make:queued",
      "hf-make:started",
      "hf-make:succeeded",
      "hf-make:handoff",
      "hf-pass:accepted",
      "hf-pass:queued",
      "hf-pass:started",
      "hf-pass:succeeded",
      "hf-pass:handoff",
      "hf-check:accepted",
      "hf-check:queued",
      "hf-check:started",
      "hf-check:succeeded",
    ]);
    const handoffEvent = events.find((e) => e.type === "handoff");
    expect(handoffEvent).toMatchObject({ jobId: root.id, to: "hf-pass", next: second.id });
  });

  test("a handoff with carryFiles false starts the next workspace without the files", async () => {
    await agent(
      "hf-drop",
      `${PRELUDE}
      fs.writeFileSync("out/secret.txt", "not for the next one");
      done({ handoff: { to: "hf-look", carryFiles: false } });`,
      ["hf-look"],
    );
    await agent("hf-look", `${PRELUDE} done({ output: { sawFile: fs.existsSync("out/secret.txt"), input } });`);
    const { job } = await client.submit({ agent: "hf-drop" });
    const last = await client.waitForChain(job.id);
    expect(last.result?.output).toEqual({ sawFile: false, input: null });
    expect(last.spec?.files).toEqual([]);
  });

  test("a reviewer sends the work back twice, then approves", async () => {
    await agent(
      "hf-coder",
      `${PRELUDE}
      const round = chain.history.filter((h) => h.agent === "hf-coder").length + 1;
      fs.appendFileSync("out/code.txt", "round " + round + (input && input.feedback ? " after: " + input.feedback : "") + "\\n");
      done({ summary: "wrote round " + round, handoff: { to: "hf-reviewer", input: { round } } });`,
      ["hf-reviewer"],
    );
    await agent(
      "hf-reviewer",
      `${PRELUDE}
      const reviews = chain.history.filter((h) => h.agent === "hf-reviewer").length;
      if (reviews < 2) done({ summary: "needs work", handoff: { to: "hf-coder", input: { feedback: "fix " + (reviews + 1) } } });
      else done({ summary: "approved", output: { approved: true, code: fs.readFileSync("out/code.txt", "utf8") } });`,
      ["hf-coder"],
    );
    const { job } = await client.submit({ agent: "hf-coder" });
    const last = await client.waitForChain(job.id);
    expect(last).toMatchObject({ agent: "hf-reviewer", state: "succeeded", chain: { depth: 5, root: job.id } });
    expect(last.result?.output).toEqual({ approved: true, code: "round 1\nround 2 after: fix 1\nround 3 after: fix 2\n" });
    expect(last.chain?.history.map((h) => `${h.agent}:${h.summary}`)).toEqual([
      "hf-coder:wrote round 1",
      "hf-reviewer:needs work",
      "hf-coder:wrote round 2",
      "hf-reviewer:needs work",
      "hf-coder:wrote round 3",
    ]);
  });

  test("a handoff to an agent not among the declared handoffs is refused with the reason, and nothing is started", async () => {
    await agent("hf-target", `${PRELUDE} done({});`);
    await agent("hf-rogue", `${PRELUDE} done({ summary: "trying", handoff: { to: "hf-target" } });`, ["hf-other"]);
    const { job } = await client.submit({ agent: "hf-rogue" });
    const last = await client.waitForChain(job.id);
    expect(last.id).toBe(job.id);
    expect(last.state).toBe("succeeded");
    expect(last.handoff).toMatchObject({
      to: "hf-target",
      error: {
        code: ErrorCode.handoffRefused,
        message: "agent hf-rogue may not hand off to hf-target: its declared handoffs are hf-other; add hf-target to its handoffs",
      },
    });
    expect(last.handoff?.jobId).toBeUndefined();
    const refused = (await chainEvents(job.id)).find((e) => e.kind === "job" && e.type === "handoff_refused");
    expect(refused).toMatchObject({ to: "hf-target", error: { code: ErrorCode.handoffRefused } });
    expect((await client.listJobs({ agent: "hf-target" })).jobs).toEqual([]);
  });

  test("a ping-pong loop is stopped by the hop limit, and by the visit limit", async () => {
    const pingPong = (me: string, other: string) =>
      agent(me, `${PRELUDE} done({ summary: "${me}", handoff: { to: "${other}" } });`, [other]);
    await pingPong("hf-ping", "hf-pong");
    await pingPong("hf-pong", "hf-ping");

    const hops = await client.submit({ agent: "hf-ping", chainLimits: { maxHops: 3, maxVisits: 50 } });
    const stoppedByHops: JobRecord = await client.waitForChain(hops.job.id);
    expect(stoppedByHops.chain?.depth).toBe(3);
    expect(stoppedByHops.handoff?.error?.message).toBe("the chain reached its limit of 3 handoffs (maxHops); not handing off to hf-ping");

    // The default limits: 10 hops, 5 jobs per agent. Ping runs 5 times, then may not run a 6th.
    const visits = await client.submit({ agent: "hf-ping" });
    const stoppedByVisits = await client.waitForChain(visits.job.id);
    expect(stoppedByVisits).toMatchObject({ agent: "hf-pong", chain: { depth: 9 } });
    expect(stoppedByVisits.handoff?.error?.message).toBe("agent hf-ping already ran 5 times in this chain, its limit (maxVisits 5)");
  });

  test("boxcar submit --wait exits 1 when the chain ends on a refused handoff; --max-hops and --max-visits set its limits", async () => {
    const cli = (...args: string[]) => boxcar(system.nats.url, system.nats.topology.names.prefix, args);
    await agent("hf-cli-target", `${PRELUDE} done({});`);
    await agent("hf-cli-rogue", `${PRELUDE} done({ summary: "trying", handoff: { to: "hf-cli-target" } });`);
    const refused = await cli("submit", "hf-cli-rogue", "--wait");
    expect(refused.code, refused.stderr).toBe(1);
    expect(refused.stderr).toContain("succeeded, but its handoff to hf-cli-target was refused: agent hf-cli-rogue may not hand off");

    await agent("hf-cli-loop", `${PRELUDE} done({ summary: "again", handoff: { to: "hf-cli-loop" } });`, ["hf-cli-loop"]);
    const byHops = await cli("submit", "hf-cli-loop", "--max-hops", "2", "--max-visits", "50", "--wait", "--json");
    expect(byHops.code, byHops.stderr).toBe(1);
    const last = JSON.parse(byHops.stdout) as JobRecord;
    expect(last.chain?.depth).toBe(2);
    expect(last.chain?.limits).toMatchObject({ maxHops: 2, maxVisits: 50 });
    expect(last.handoff?.error?.message).toContain("limit of 2 handoffs (maxHops)");

    const bad = await cli("submit", "hf-cli-loop", "--max-visits", "many");
    expect([bad.code, bad.stderr]).toEqual([2, expect.stringContaining("--max-visits must be a whole number, got many")]);
  });

  test("a failed job's handoff request is ignored: following its events ends with it", async () => {
    await agent("hf-sink", `${PRELUDE} done({});`);
    await agent("hf-crash", `${PRELUDE} done({ handoff: { to: "hf-sink" } }); process.exit(1);`, ["hf-sink"]);
    const { job } = await client.submit({ agent: "hf-crash" });
    const types = (await chainEvents(job.id)).filter((e) => e.kind === "job").map((e) => e.type);
    expect(types).toEqual(["accepted", "queued", "started", "failed"]);
    expect(await client.waitForChain(job.id)).toMatchObject({ id: job.id, state: "failed" });
    expect((await client.getJob(job.id)).handoff).toBeUndefined();
  });

  test("bad chain limits are refused with the field named", async () => {
    await expect(client.submit({ agent: "hf-ping", chainLimits: { maxHops: -1 } })).rejects.toMatchObject({
      code: ErrorCode.invalid,
      issues: [expect.objectContaining({ path: "chainLimits.maxHops" })],
    });
  });
});
