import type { BoxcarClient } from "@boxcar/client";
import { type BoxcarEvent, ErrorCode, type WorkflowDefinitionInput, type WorkflowRun } from "@boxcar/protocol";
import { eventually, type LocalSystem, localSystem, scratch } from "@boxcar/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { isAlive, waitGone } from "./helpers/process.js";

let system: LocalSystem;
let client: BoxcarClient;

beforeAll(async () => {
  system = await localSystem({ worker: { concurrency: 6 } });
  client = system.client;
});
afterAll(async () => {
  await system?.[Symbol.asyncDispose]();
});

/** A trusted host agent whose command is a Node.js script, with `input`, `fs` and `done(result)` defined. */
async function agent(name: string, script: string, extra: Record<string, unknown> = {}) {
  await client.applyAgent({
    name,
    command: ["node", "-e", `${PRELUDE}\n${script}`],
    trusted: true,
    runtime: { sandbox: "host", timeout: "30s" },
    ...extra,
  });
}

const PRELUDE = `
const fs = require("node:fs");
const input = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8"));
const done = (r) => fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify(r));
const files = (dir) => fs.existsSync(dir) ? fs.readdirSync(dir, { recursive: true }).filter((f) => fs.statSync(dir + "/" + f).isFile()).sort() : [];
`;

async function run(workflow: WorkflowDefinitionInput, input: unknown = null): Promise<WorkflowRun> {
  const { run } = await client.startRun({ workflow, input: input as never });
  return client.waitForRun(run.id);
}

async function runEvents(runId: string): Promise<BoxcarEvent[]> {
  const events: BoxcarEvent[] = [];
  for await (const e of client.runEvents(runId)) events.push(e);
  return events;
}

const workflowEvents = (events: BoxcarEvent[]) =>
  events.flatMap((e) =>
    e.kind === "workflow" ? [`${e.type}${e.step ? `:${e.step}` : ""}${e.index !== undefined ? `[${e.index}]` : ""}`] : [],
  );

beforeAll(async () => {
  await agent(
    "wf-echo",
    `fs.mkdirSync("out", { recursive: true });
     fs.writeFileSync("out/seen.json", JSON.stringify({ input, files: files("in") }));
     done({ output: { input, files: files("in") }, summary: "echoed" });`,
  );
});

describe("declarative workflows", () => {
  test("a three-step pipeline passes outputs through templates and files byte-exact under in/<step>/", async () => {
    await agent(
      "wf-plan",
      `fs.mkdirSync("out", { recursive: true });
       fs.writeFileSync("out/plan.bin", require("node:crypto").randomBytes(200000));
       done({ output: { tasks: ["a", "b"], topic: input.topic }, summary: "planned " + input.topic });`,
    );
    await agent(
      "wf-code",
      `const plan = fs.readFileSync("in/plan/out/plan.bin");
       fs.mkdirSync("out", { recursive: true });
       fs.writeFileSync("out/plan-copy.bin", plan);
       done({ output: { did: input.tasks, planSha: require("node:crypto").createHash("sha256").update(plan).digest("hex") } });`,
    );
    const finished = await run(
      {
        name: "pipeline",
        steps: [
          { name: "plan", agent: "wf-plan", input: { topic: "{{ input.topic }}" } },
          { name: "code", agent: "wf-code", needs: ["plan"], input: { tasks: "{{ steps.plan.output.tasks }}" } },
          {
            name: "review",
            agent: "wf-echo",
            needs: ["code"],
            input: { summary: "plan said: {{ steps.plan.summary }}", did: "{{ steps.code.output.did }}" },
          },
        ],
        output: { reviewed: "{{ steps.review.output.input }}", sha: "{{ steps.code.output.planSha }}" },
      },
      { topic: "queues" },
    );
    expect(finished.state).toBe("succeeded");
    expect(Object.values(finished.steps).map((s) => s.state)).toEqual(["succeeded", "succeeded", "succeeded"]);
    const planJob = await client.getJob(finished.steps.plan?.instances[0]?.jobs[0] as string);
    const planSha = planJob.artifacts.find((a) => a.path === "out/plan.bin")?.sha256;
    expect(finished.output).toEqual({ reviewed: { summary: "plan said: planned queues", did: ["a", "b"] }, sha: planSha });

    const reviewJob = await client.getJob(finished.steps.review?.instances[0]?.jobs[0] as string);
    // Only the needed step's files are carried: review needs code, not plan.
    expect(reviewJob.result?.output).toMatchObject({ files: ["code/out/plan-copy.bin"] });
    expect(reviewJob.chain).toMatchObject({ run: finished.id, step: "review", depth: 0 });
    expect(reviewJob.spec?.labels).toMatchObject({ "boxcar.run": finished.id, "boxcar.step": "review" });

    const events = await runEvents(finished.id);
    expect(workflowEvents(events)).toEqual([
      "started",
      "step_started:plan",
      "step_finished:plan",
      "step_started:code",
      "step_finished:code",
      "step_started:review",
      "step_finished:review",
      "succeeded",
    ]);
    // The run's events include its jobs', each marked with the run.
    const jobTypes = events.filter((e) => e.kind === "job" && e.jobId === reviewJob.id).map((e) => e.type);
    expect(jobTypes).toEqual(expect.arrayContaining(["accepted", "queued", "started", "succeeded"]));
  });

  test("a fan-out of N jobs, and a join that sees every result and every file", async () => {
    await agent(
      "wf-square",
      `fs.mkdirSync("out", { recursive: true });
       fs.writeFileSync("out/n.txt", String(input.n));
       done({ output: input.n * input.n, summary: "squared " + input.n });`,
    );
    const n = 7;
    const finished = await run(
      {
        name: "fan",
        steps: [
          { name: "start", agent: "wf-echo", input: { numbers: "{{ input.numbers }}" } },
          {
            name: "square",
            agent: "wf-square",
            needs: ["start"],
            forEach: "{{ steps.start.output.input.numbers }}",
            input: { n: "{{ item }}", i: "{{ index }}" },
          },
          { name: "side", agent: "wf-echo", needs: ["start"], input: "side" },
          {
            name: "join",
            agent: "wf-echo",
            needs: ["square", "side"],
            input: { squares: "{{ steps.square.output }}", side: "{{ steps.side.output.input }}" },
          },
        ],
      },
      { numbers: Array.from({ length: n }, (_, i) => i + 1) },
    );
    expect(finished.state).toBe("succeeded");
    expect(finished.steps.square?.instances).toHaveLength(n);
    const joined = finished.output as { input: { squares: number[]; side: string }; files: string[] };
    expect(joined.input).toEqual({ squares: [1, 4, 9, 16, 25, 36, 49], side: "side" });
    expect(joined.files).toEqual(
      // The files of the steps it needs, not of theirs (start).
      [...Array.from({ length: n }, (_, i) => `square/${i}/out/n.txt`), "side/out/seen.json"].sort(),
    );
    const types = workflowEvents(await runEvents(finished.id));
    expect(types).toContain("fanned_out:square");
    expect(types).toContain("joined:join");
    expect(types.filter((t) => t.startsWith("step_started:square["))).toHaveLength(n);
  });

  test("a condition skips a step and the steps that need it; the default input carries the needed outputs", async () => {
    const finished = await run(
      {
        name: "branches",
        steps: [
          { name: "check", agent: "wf-echo", input: { approve: "{{ input.approve }}" } },
          { name: "ship", agent: "wf-echo", needs: ["check"], if: "{{ steps.check.output.input.approve }}" },
          { name: "announce", agent: "wf-echo", needs: ["ship"] },
          { name: "rework", agent: "wf-echo", needs: ["check"], if: "{{ steps.check.output.input.approve == false }}" },
        ],
      },
      { approve: false },
    );
    expect(finished.state).toBe("succeeded");
    expect(finished.steps.ship).toMatchObject({
      state: "skipped",
      reason: "its condition {{ steps.check.output.input.approve }} is false",
    });
    expect(finished.steps.announce).toMatchObject({ state: "skipped", reason: "it needs ship, which was skipped" });
    expect(finished.steps.rework?.state).toBe("succeeded");
    expect(finished.output).toMatchObject({
      input: { input: { approve: false }, steps: { check: { state: "succeeded", output: { input: { approve: false } } } } },
    });
  });

  test("a failed step fails the run with the reason; a step's retry policy is honoured first", async () => {
    await agent("wf-fail", `console.error("nope"); process.exit(3);`);
    await agent("wf-flaky", `if (process.env.BOXCAR_ATTEMPT === "1") process.exit(5); done({ output: "second time" });`);
    const finished = await run({
      name: "failing",
      steps: [
        { name: "flaky", agent: "wf-flaky", retry: { maxAttempts: 2, delay: "100ms", jitter: false } },
        { name: "broken", agent: "wf-fail", needs: ["flaky"] },
        { name: "after", agent: "wf-echo", needs: ["broken"] },
      ],
    });
    expect(finished.steps.flaky?.state).toBe("succeeded");
    expect(finished.steps.broken).toMatchObject({ state: "failed", reason: "agent exited with code 3" });
    expect(finished.steps.after).toMatchObject({ state: "cancelled", reason: "the run failed" });
    expect(finished).toMatchObject({
      state: "failed",
      error: { code: ErrorCode.workflowFailed, message: "step broken failed: agent exited with code 3" },
    });
  });

  test("one failed item of a fan-out fails the run at once and cancels the other items", async () => {
    await agent("wf-item", `if (input === 2) process.exit(9); setTimeout(() => done({ output: input }), 30000);`);
    const finished = await run(
      { name: "fan-fail", steps: [{ name: "items", agent: "wf-item", forEach: "{{ input }}", input: "{{ item }}" }] },
      [1, 2, 3],
    );
    expect(finished).toMatchObject({ state: "failed", error: { message: "step items failed: item 1: agent exited with code 9" } });
    expect(finished.steps.items?.instances.map((i) => i.state)).toEqual(["cancelled", "failed", "cancelled"]);
  });

  test("cancel mid-run stops the running steps' agents and starts nothing more", async () => {
    await using tmp = await scratch("wf-cancel-");
    const dir = tmp.path;
    await agent(
      "wf-sleep",
      `fs.writeFileSync(${JSON.stringify(dir)} + "/" + process.env.BOXCAR_JOB_ID, String(process.pid)); setTimeout(() => done({}), 60000);`,
    );
    const { run: started } = await client.startRun({
      workflow: {
        name: "long",
        steps: [
          { name: "a", agent: "wf-sleep" },
          { name: "b", agent: "wf-sleep" },
          { name: "c", agent: "wf-echo", needs: ["a", "b"] },
        ],
      },
    });
    const pids = await pidsWhenRunning(dir, 2);
    const cancelled = await client.cancelRun(started.id);
    expect(cancelled.state).toBe("cancelled");
    const finished = await client.waitForRun(started.id);
    expect(Object.fromEntries(Object.entries(finished.steps).map(([k, s]) => [k, s.state]))).toEqual({
      a: "cancelled",
      b: "cancelled",
      c: "cancelled",
    });
    for (const inst of [finished.steps.a?.instances[0], finished.steps.b?.instances[0]]) {
      expect((await client.getJob(inst?.jobs[0] as string)).state).toBe("cancelled");
    }
    for (const pid of pids) await waitGone(pid);
    expect(pids.filter(isAlive)).toEqual([]);
    expect(await client.cancelRun(started.id)).toMatchObject({ state: "cancelled" }); // idempotent
    expect(workflowEvents(await runEvents(started.id))).not.toContain("step_started:c");
  });

  test("a step's job cancelled on its own ends the run cancelled, saying which step", async () => {
    await agent("wf-wait", `setTimeout(() => done({}), 30000);`);
    const { run: started } = await client.startRun({
      workflow: {
        name: "interrupted",
        steps: [
          { name: "wait", agent: "wf-wait" },
          { name: "next", agent: "wf-echo", needs: ["wait"] },
        ],
      },
    });
    const jobId = await eventually(async () => (await client.getRun(started.id)).steps.wait?.instances[0]?.jobs[0], "the step's job");
    await eventually(async () => ((await client.getJob(jobId)).state === "running" ? true : undefined), "the job to run");
    await client.cancelJob(jobId);
    const finished = await client.waitForRun(started.id);
    expect(finished).toMatchObject({ state: "cancelled", error: { code: ErrorCode.cancelled, message: "step wait was cancelled" } });
    expect(finished.steps.next).toMatchObject({ state: "cancelled", reason: "the run was cancelled" });
  });

  test("a step's agent may hand off inside the run: the step ends with the chain, within the run's limits", async () => {
    await agent("wf-ping", `done({ summary: "ping", handoff: { to: "wf-pong" } });`, { handoffs: ["wf-pong"] });
    await agent("wf-pong", `done({ summary: "pong", output: "pong", ...(input && input.again ? { handoff: { to: "wf-ping" } } : {}) });`, {
      handoffs: ["wf-ping"],
    });
    const ok = await run({ name: "chain-step", steps: [{ name: "talk", agent: "wf-ping" }] });
    expect(ok.state).toBe("succeeded");
    expect(ok.steps.talk?.instances[0]?.jobs).toHaveLength(2);
    expect(ok.output).toBe("pong");
    expect(workflowEvents(await runEvents(ok.id))).toContain("handoff:talk");

    await agent("wf-loop", `done({ handoff: { to: "wf-loop" } });`, { handoffs: ["wf-loop"] });
    const looped = await run({ name: "loop", limits: { maxHops: 2 }, steps: [{ name: "spin", agent: "wf-loop" }] });
    expect(looped.state).toBe("failed");
    expect(looped.steps.spin?.instances[0]?.jobs).toHaveLength(3);
    expect(looped.error?.message).toBe("step spin failed: the chain reached its limit of 2 handoffs (maxHops); not handing off to wf-loop");
  });

  test("a run past its deadline fails and its running job is cancelled", async () => {
    await agent("wf-slow", `setTimeout(() => done({}), 30000);`);
    const finished = await run({ name: "late", limits: { deadline: "1s" }, steps: [{ name: "slow", agent: "wf-slow" }] });
    expect(finished).toMatchObject({ state: "failed", error: { message: expect.stringMatching(/^the run passed its deadline of /) } });
    expect((await client.getJob(finished.steps.slow?.instances[0]?.jobs[0] as string)).state).toBe("cancelled");
  });

  test("a step whose input template finds nothing fails the run naming the reference", async () => {
    const finished = await run({
      name: "missing",
      steps: [
        { name: "first", agent: "wf-echo" },
        { name: "second", agent: "wf-echo", needs: ["first"], input: "{{ steps.first.output.nothing.here }}" },
      ],
    });
    expect(finished.state).toBe("failed");
    expect(finished.error?.message).toBe(
      'step second failed: the input of step second: steps.first.output.nothing.here is not there (no "nothing")',
    );
  });

  test("bad workflows are refused with the place named: a cycle, an unknown agent, a bad template reference", async () => {
    await expect(
      client.startRun({
        workflow: {
          name: "cyclic",
          steps: [
            { name: "a", agent: "wf-echo", needs: ["b"] },
            { name: "b", agent: "wf-echo", needs: ["a"] },
          ],
        },
      }),
    ).rejects.toMatchObject({
      code: ErrorCode.invalid,
      issues: [{ path: "workflow.steps[0].needs", message: "needs form a cycle: a → b → a" }],
    });
    await expect(
      client.startRun({
        workflow: {
          name: "ghost",
          steps: [
            { name: "a", agent: "wf-echo" },
            { name: "b", agent: "nobody" },
          ],
        },
      }),
    ).rejects.toMatchObject({ code: ErrorCode.unknownAgent, issues: [expect.objectContaining({ path: "workflow.steps[1].agent" })] });
    await expect(
      client.startRun({ workflow: { name: "badref", steps: [{ name: "a", agent: "wf-echo", input: { x: "{{ steps.zz.output }}" } }] } }),
    ).rejects.toMatchObject({ code: ErrorCode.invalid, issues: [{ path: "workflow.steps[0].input.x", message: 'no step named "zz"' }] });
    expect(await client.listRuns({ workflow: "ghost" })).toEqual([]);
    await expect(client.cancelRun("wf-nope")).rejects.toMatchObject({ code: ErrorCode.notFound });
  });

  test("workflows.list pages through the runs newest first, keyed runs in their place, with its filters", async () => {
    const name = "paged";
    const started: string[] = [];
    for (let i = 0; i < 5; i++) {
      const request = { workflow: { name, steps: [{ name: "a", agent: "wf-echo" }] }, ...(i === 2 ? { idempotencyKey: "paged-2" } : {}) };
      started.push((await client.startRun(request)).run.id);
      await new Promise((r) => setTimeout(r, 5)); // distinct creation times
    }
    const seen: string[] = [];
    let after = ""; // "" asks for the first page of a paged listing
    for (let pages = 0; pages < 10; pages++) {
      const page = await client.listRunsPage({ workflow: name, limit: 2, after });
      expect(page.runs.length).toBeLessThanOrEqual(2);
      seen.push(...page.runs.map((r) => r.id));
      if (!page.next) break;
      after = page.next;
    }
    expect(seen).toEqual([...started].reverse());
    expect((await client.listRunsPage({ workflow: name, limit: 5, after: "" })).next).toBeUndefined();
    // A request without `after` (a client from before paging) is not told of more.
    expect(await client.listRunsPage({ workflow: name, limit: 2 })).toEqual({ runs: expect.any(Array) });
    await expect(client.listRunsPage({ after: "wf-abc" })).rejects.toMatchObject({
      code: "invalid",
      issues: [expect.objectContaining({ path: "after" })],
    });
    expect(await client.listRuns({ workflow: name, state: "cancelled" })).toEqual([]);
  });

  test("an idempotency key starts a run once", async () => {
    const first = await client.startRun({ workflow: { name: "keyed", steps: [{ name: "a", agent: "wf-echo" }] }, idempotencyKey: "k-1" });
    const second = await client.startRun({ workflow: { name: "keyed", steps: [{ name: "a", agent: "wf-echo" }] }, idempotencyKey: "k-1" });
    expect(second).toMatchObject({ duplicate: true, run: { id: first.run.id } });
    expect((await client.waitForRun(first.run.id)).steps.a?.instances).toHaveLength(1);
  });
});

/** Waits until `count` agents have written their pid files in `dir`. */
async function pidsWhenRunning(dir: string, count: number): Promise<number[]> {
  const { readdir, readFile } = await import("node:fs/promises");
  for (let i = 0; i < 200; i++) {
    const names = await readdir(dir);
    if (names.length >= count) return Promise.all(names.map(async (n) => Number(await readFile(`${dir}/${n}`, "utf8"))));
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`fewer than ${count} agents started`);
}
