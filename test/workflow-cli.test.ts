import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { type BoxcarClient, createClient } from "@boxcar/client";
import { type Dispatcher, startDispatcher } from "@boxcar/dispatcher";
import { BoxcarEvent, JobRecord, parseAgentFile, WorkflowRun } from "@boxcar/protocol";
import { eventually, type NatsFixture, natsFixture, type Scratch, scratch } from "@boxcar/testing";
import { createWorker, type Worker } from "@boxcar/worker";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";

const REPO = new URL("..", import.meta.url).pathname;
const REVIEW_LOOP = join(REPO, "examples/workflows/review-loop");
const RESEARCH = join(REPO, "examples/workflows/research");

let nats: NatsFixture;
let dispatcher: Dispatcher;
let worker: Worker;
let client: BoxcarClient;
let dir: Scratch;

beforeAll(async () => {
  nats = await natsFixture();
  dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  worker = createWorker({ ...nats.workerRole, concurrency: 4 });
  void worker.run();
  client = createClient(nats.topology);
  dir = await scratch("boxcar-workflow-cli-");
});

afterAll(async () => {
  await worker?.close();
  await dispatcher?.close();
  await nats?.[Symbol.asyncDispose]();
  await dir?.[Symbol.asyncDispose]();
});

const cli = (...args: string[]) => boxcar(nats.url, nats.topology.names.prefix, args);

/** Runs the CLI and fails with its output when it does not exit with `code`. */
async function ok(args: string[], code = 0) {
  const result = await cli(...args);
  if (result.code !== code) throw new Error(`boxcar ${args.join(" ")} exited ${result.code}\n${result.stderr}\n${result.stdout}`);
  return result;
}

const jsonLines = (text: string) =>
  text
    .trim()
    .split("\n")
    .map((line) => BoxcarEvent.parse(JSON.parse(line)));

async function writeFiles(files: Record<string, string>): Promise<void> {
  for (const [name, text] of Object.entries(files)) await writeFile(join(dir.path, name), text);
}

describe("the review-loop example: dynamic handoffs through the CLI", () => {
  const agents = ["planner.yaml", "coder.yaml", "reviewer.yaml"].map((f) => join(REVIEW_LOOP, f));

  test("submit planner --wait waits for the whole chain: the reviewer sends the code back once, then approves it", async () => {
    await ok(["agent", "apply", "-f", ...agents]);
    const submitted = await ok(["submit", "planner", "--input", '{"task":"slugs for blog titles"}', "--wait", "--json"]);
    const last = JobRecord.parse(JSON.parse(submitted.stdout));
    expect(last).toMatchObject({ agent: "reviewer", state: "succeeded" });
    expect(last.result?.output).toEqual({
      approved: true,
      reviews: 2,
      checks: 5,
      files: ["out/slugify.mjs", "out/plan.md", "out/CHANGELOG.md"],
    });
    expect(last.chain?.depth).toBe(4);
    expect(last.chain?.history.map((h) => `${h.agent}: ${h.summary}`)).toEqual([
      "planner: planned 5 requirements",
      "coder: round 1: implemented lowercase, hyphens",
      "reviewer: review 1: 3 checks fail (punctuation, accents, trim)",
      "coder: round 2: implemented punctuation, accents, trim",
    ]);
    const root = last.chain?.root as string;

    // The files went along the chain: the last workspace held every round's files.
    expect(last.artifacts.map((a) => a.path).sort()).toEqual([
      "out/CHANGELOG.md",
      "out/implementation.json",
      "out/plan.md",
      "out/review-1.md",
      "out/review-2.md",
      "out/slugify.mjs",
    ]);
    const out = join(dir.path, "review-loop");
    await ok(["artifacts", last.id, "--out", out]);
    const { slugify } = (await import(pathToFileURL(join(out, "out/slugify.mjs")).href)) as { slugify: (s: string) => string };
    expect(slugify("  Crème Brûlée, à la Carte! ")).toBe("creme-brulee-a-la-carte");
    expect(await readFile(join(out, "out/review-1.md"), "utf8")).toContain(
      '- [ ] accents: slugify("Crème Brûlée") = "crème-brûlée", expected "creme-brulee"',
    );
    expect(await readFile(join(out, "out/plan.md"), "utf8")).toContain("Task: slugs for blog titles");
    expect(await readFile(join(out, "out/CHANGELOG.md"), "utf8")).toBe(
      "- round 1: implemented lowercase, hyphens\n- round 2: implemented punctuation, accents, trim\n",
    );

    // status shows the handoff decision on the first job and the chain position on the last.
    const first = await ok(["status", root]);
    const firstRecord = await client.getJob(root);
    expect(first.stdout).toContain(`handoff   handed off to coder as job ${firstRecord.handoff?.jobId}`);
    const lastStatus = await ok(["status", last.id]);
    expect(lastStatus.stdout).toContain(`chain     root ${root}, depth 4, after ${last.chain?.parent}`);
    expect(lastStatus.stdout).toContain("planner → coder → reviewer → coder → reviewer");

    // events follows the chain job after job; --no-chain keeps to the one job.
    const events = jsonLines((await ok(["events", root, "--follow", "--json"])).stdout).filter((e) => e.kind === "job");
    expect(events.filter((e) => e.type === "succeeded").map((e) => e.agent)).toEqual(["planner", "coder", "reviewer", "coder", "reviewer"]);
    expect(events.filter((e) => e.type === "handoff").map((e) => (e.kind === "job" ? e.to : ""))).toEqual([
      "coder",
      "reviewer",
      "coder",
      "reviewer",
    ]);
    expect(events.at(-1)).toMatchObject({ jobId: last.id, type: "succeeded" });
    const own = jsonLines((await ok(["events", root, "--no-chain", "--json"])).stdout);
    expect(new Set(own.map((e) => (e.kind === "worker" ? "" : e.jobId)))).toEqual(new Set([root]));
  });

  test("submit --follow streams every job's events and output down the chain, and ends with the last job", async () => {
    await ok(["agent", "apply", "-f", ...agents]);
    const followed = await ok(["submit", "planner", "--follow"]);
    // Each job's output, in chain order (its ::progress lines are output too).
    const progress = followed.stdout.split("\n").filter((l) => l.startsWith("::progress"));
    expect(progress).toEqual([
      "::progress plan written: 5 requirements",
      "::progress round 1: slugify.mjs implements lowercase, hyphens",
      "::progress review 1: 2/5 checks pass",
      "::progress round 2: slugify.mjs implements lowercase, hyphens, punctuation, accents, trim",
      "::progress review 2: 5/5 checks pass",
    ]);
    expect(followed.stderr.match(/job\s+handoff\s+handed off to/g)).toHaveLength(4);
    // Each line says which job of the chain it is about: its agent and how many handoffs came before it.
    expect(followed.stderr).toMatch(/ planner#0 +job +started/);
    expect(followed.stderr).toMatch(/ reviewer#4 +job +succeeded/);
    expect(followed.stderr).toMatch(/ reviewer#4 +sandbox +exec_exited/);
    const tagged = followed.stderr.split("\n").filter((l) => /^\d\d:\d\d:\d\d\.\d{3} {2}(job|sandbox) /.test(l));
    expect(tagged).toEqual([]); // no event line without its tag
    expect(followed.stderr).toMatch(/the chain ended with job \S+ \(agent reviewer, 4 handoffs after \S+\)/);
    expect(followed.stdout).toMatch(/agent\s+reviewer/);
    expect(followed.stdout).toMatch(/summary\s+approved after 2 reviews/);
  });

  test("a refused handoff is shown by status, and submit --wait ends with the job that asked for it, exiting 1", async () => {
    await writeFiles({
      "rogue.yaml": `
name: rogue
command: |
  printf '{"summary":"tried","handoff":{"to":"planner"}}' > "$BOXCAR_RESULT_FILE"
trusted: true
runtime: { sandbox: host, timeout: 30s }
handoffs: [coder]
`,
    });
    await ok(["agent", "apply", "-f", join(dir.path, "rogue.yaml")]);
    // The job succeeded, but the work it wanted to hand on was not: not a success for --wait.
    const run = await ok(["submit", "rogue", "--wait"], 1);
    expect(run.stdout).toMatch(/agent\s+rogue/);
    expect(run.stdout).toContain(
      "handoff   to planner refused: agent rogue may not hand off to planner: its declared handoffs are coder; add planner to its handoffs",
    );
    expect(run.stderr).toContain("succeeded, but its handoff to planner was refused");
    expect(run.stderr).not.toContain("the chain ended with");
  });
});

describe("the research example: a declarative workflow through boxcar run", () => {
  const file = join(RESEARCH, "research.workflow.yaml");
  const agents = ["research-planner.yaml", "researcher.yaml", "research-writer.yaml"].map((f) => join(RESEARCH, "agents", f));

  test("run --wait plans, fans out one job per question, joins them into a report, and prints the output", async () => {
    await ok(["agent", "apply", "-f", ...agents]);
    const started = await ok([
      "run",
      file,
      "--input",
      '{"topic":"NATS JetStream","questions":3}',
      "--label",
      "team=docs",
      "--wait",
      "--json",
    ]);
    const run = WorkflowRun.parse(JSON.parse(started.stdout));
    const questions = ["What is NATS JetStream?", "How is NATS JetStream used in practice?", "What are the limits of NATS JetStream?"];
    expect(run).toMatchObject({ state: "succeeded", labels: { team: "docs" } });
    expect(run.output).toEqual({
      topic: "NATS JetStream",
      questions,
      report: { file: "out/report.md", sections: 3, keyPoints: 4 },
      summary: "report on NATS JetStream: 3 sections, 4 key points",
    });
    expect(run.steps.investigate?.instances.map((i) => [i.index, i.state, (i.output as { question: string }).question])).toEqual(
      questions.map((q, i) => [i, "succeeded", q]),
    );
    // Each researcher saw the plan's file under in/plan/.
    expect(run.steps.investigate?.instances.every((i) => (i.output as { listedInPlan: boolean }).listedInPlan)).toBe(true);

    // The writer's workspace held every researcher's notes under in/investigate/<index>/.
    const reportJob = run.steps.report?.instances[0]?.jobs[0] as string;
    const out = join(dir.path, "research");
    await ok(["artifacts", reportJob, "--out", out]);
    const report = await readFile(join(out, "out/report.md"), "utf8");
    for (const q of questions) expect(report).toContain(`## ${q}`);
    expect(report).toContain("- NATS JetStream: its limits");
    const reportRecord = await client.getJob(reportJob);
    expect(reportRecord.spec?.files.map((f) => f.path).sort()).toEqual([
      "in/investigate/0/out/notes.md",
      "in/investigate/1/out/notes.md",
      "in/investigate/2/out/notes.md",
      "in/plan/out/plan.md",
    ]);

    // The text form names each step and each item of the fan-out.
    const text = await ok(["run", file, "--input", '{"topic":"Raft","questions":2}', "--wait"]);
    expect(text.stdout).toMatch(/state\s+succeeded/);
    expect(text.stdout).toMatch(/investigate\s+succeeded\s+2 items\s+2 succeeded/);
    expect(text.stdout).toMatch(/\[1]\s+succeeded\s+\S+\s+answered: How is Raft used in practice\?/);
    expect(text.stdout).toContain('output    {"topic":"Raft"');

    // workflow status, events and ls show the first run.
    const status = await ok(["workflow", "status", run.id]);
    expect(status.stdout).toMatch(/plan\s+succeeded\s+\S+\s+planned 3 questions on NATS JetStream/);
    expect(status.stdout).toMatch(/report\s+succeeded/);
    expect(WorkflowRun.parse(JSON.parse((await ok(["workflow", "status", run.id, "--json"])).stdout))).toEqual(run);
    const events = jsonLines((await ok(["workflow", "events", run.id, "--json"])).stdout);
    const flow = events.filter((e) => e.kind === "workflow").map((e) => e.type);
    expect(flow[0]).toBe("started");
    expect(flow.at(-1)).toBe("succeeded");
    expect(flow).toEqual(expect.arrayContaining(["fanned_out", "joined", "step_started", "step_finished"]));
    // The jobs' events are there too: five jobs, each succeeded once.
    expect(events.filter((e) => e.kind === "job" && e.type === "succeeded")).toHaveLength(5);
    const lines = (await ok(["workflow", "events", run.id])).stdout;
    expect(lines).toMatch(/investigate\[2]\s+job\s+succeeded\s+answered: What are the limits of NATS JetStream\?/);
    expect(lines).toMatch(/report\s+workflow joined\s+report joins plan, investigate/);
    const listed = JSON.parse((await ok(["workflow", "ls", "--workflow", "research", "--json"])).stdout) as WorkflowRun[];
    expect(listed.map((r) => r.id)).toContain(run.id);
    expect((await ok(["workflow", "ls", "--state", "failed", "--json"])).stdout.trim()).toBe("[]");
  });

  test("run --follow prints the run's events as they happen, each with its step, then the run", async () => {
    await ok(["agent", "apply", "-f", ...agents]);
    const followed = await ok(["run", file, "--input", '{"topic":"Raft","questions":2}', "--follow"]);
    expect(followed.stderr).toMatch(/started run wf-\S+ of workflow research/);
    expect(followed.stderr).toMatch(/investigate\s+workflow fanned_out\s+investigate fans out to 2 jobs/);
    expect(followed.stderr).toMatch(/investigate\[1]\s+job\s+progress\s+question 2: 2 key points/);
    expect(followed.stderr.trim().split("\n").at(-1)).toMatch(/workflow succeeded\s+all 3 steps done/);
    expect(followed.stdout).toMatch(/state\s+succeeded/);
  });
});

describe("bad workflows", () => {
  test("a bad workflow file is refused before anything is sent: exit 2 and file:line:col naming the place", async () => {
    await writeFiles({
      "cycle.yaml": "name: cyc\nsteps:\n  - name: a\n    agent: hello\n    needs: [b]\n  - name: b\n    agent: hello\n    needs: [a]\n",
      "needs.yaml": "name: nd\nsteps:\n  - name: a\n    agent: hello\n  - name: b\n    agent: hello\n    needs: [a, nope]\n",
      "template.yaml":
        'name: tp\nsteps:\n  - name: a\n    agent: hello\n  - name: b\n    agent: hello\n    input:\n      x: "{{ steps.c.output }}"\n      y: "{{ item }}"\n',
      "field.yaml": "name: fd\nsteps:\n  - name: a\n    agent: hello\n    retries: 3\n",
      "notyaml.yaml": "name: [oops\n",
    });
    const expected: Record<string, string[]> = {
      "cycle.yaml": [":5:5: steps[0].needs: needs form a cycle: a → b → a"],
      "needs.yaml": [':7:16: steps[1].needs[1]: no step named "nope"'],
      "template.yaml": [
        ':8:7: steps[1].input.x: no step named "c"',
        ":9:7: steps[1].input.y: {{ item }} is only defined in the input of a step with forEach",
      ],
      "field.yaml": [":5:5: steps[0].retries: unknown field"],
      "notyaml.yaml": [":2:1: "],
    };
    for (const [name, messages] of Object.entries(expected)) {
      const path = join(dir.path, name);
      // An unreachable server: the file is checked before the CLI connects.
      const result = await boxcar("nats://127.0.0.1:1", nats.topology.names.prefix, ["run", path, "--wait"]);
      expect(result.code, `${name}: ${result.stderr}`).toBe(2);
      expect(result.stderr).toContain("boxcar run: invalid: invalid workflow file");
      for (const message of messages) expect(result.stderr).toContain(`${path}${message}`);
    }
    const missing = await cli("run", join(dir.path, "absent.yaml"));
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("cannot read workflow file");
    const input = await cli("run", join(dir.path, "cycle.yaml"), "--input", "{nope");
    expect(input.code).toBe(2);
  });

  test("a step naming an unknown agent is refused by the dispatcher: exit 3, the step named, and its line in the file", async () => {
    await ok(["agent", "apply", "-f", join(REPO, "examples/agents/hello.yaml")]);
    const path = join(dir.path, "unknown-agent.yaml");
    await writeFiles({
      "unknown-agent.yaml":
        "name: ua\nsteps:\n  - name: first\n    agent: hello\n  - name: second\n    agent: no-such-agent\n    needs: [first]\n",
    });
    const before = (await client.listRuns()).length;
    const result = await cli("run", path, "--wait");
    expect(result.code).toBe(3);
    expect(result.stderr).toContain('boxcar run: unknown_agent: step second: no agent named "no-such-agent"');
    expect(result.stderr).toContain(`${path}:6:5: steps[1].agent: no agent named "no-such-agent"`);
    const json = await cli("run", path, "--json");
    expect(json.code).toBe(3);
    expect(JSON.parse(json.stdout)).toMatchObject({
      error: { code: "unknown_agent", issues: [{ path: "steps[1].agent", line: 6, column: 5 }] },
    });
    expect(await client.listRuns()).toHaveLength(before);
  });

  test("run --wait exits 1 when a step fails, and says which step and why", async () => {
    await ok(["agent", "apply", "-f", join(REPO, "examples/agents/hello.yaml"), join(REPO, "examples/agents/fail.yaml")]);
    await writeFiles({
      "failing.yaml": "name: failing\nsteps:\n  - name: greet\n    agent: hello\n  - name: broken\n    agent: fail\n    needs: [greet]\n",
    });
    const result = await cli("run", join(dir.path, "failing.yaml"), "--wait");
    expect(result.code).toBe(1);
    expect(result.stdout).toMatch(/state\s+failed/);
    expect(result.stdout).toMatch(/broken\s+failed\s+\S+\s+agent exited with code 3/);
    expect(result.stdout).toContain("error     workflow_failed: step broken failed: agent exited with code 3");
  });
});

describe("workflow status, events and cancel on a running run", () => {
  test("cancel stops the running step's job and the steps after it; events --follow ends with the cancel", async () => {
    await writeFiles({
      "sleepy.yaml":
        'name: sleepy\ncommand: |\n  echo "::progress napping"\n  sleep 30\ntrusted: true\nruntime: { sandbox: host, timeout: 1m }\n',
      "nap.yaml": "name: nap\nsteps:\n  - name: nap\n    agent: sleepy\n  - name: after\n    agent: hello\n    needs: [nap]\n",
    });
    await ok(["agent", "apply", "-f", join(dir.path, "sleepy.yaml"), join(REPO, "examples/agents/hello.yaml")]);
    const id = (await ok(["run", join(dir.path, "nap.yaml")])).stdout.trim();
    expect(id).toMatch(/^wf-/);
    const job = await eventually(async () => {
      const run = WorkflowRun.parse(JSON.parse((await ok(["workflow", "status", id, "--json"])).stdout));
      const jobId = run.steps.nap?.instances[0]?.jobs[0];
      return jobId && (await client.getJob(jobId)).state === "running" ? jobId : undefined;
    }, "the nap step to run");
    const running = await ok(["workflow", "status", id]);
    expect(running.stdout).toMatch(/state\s+running/);
    expect(running.stdout).toMatch(new RegExp(`nap\\s+running\\s+${job}`));
    expect(running.stdout).toMatch(/after\s+pending\s+-/);

    const following = cli("workflow", "events", id, "--follow");
    await eventually(
      async () => ((await ok(["workflow", "events", id])).stdout.includes("napping") ? true : undefined),
      "the nap job's progress",
    );
    const cancelled = await ok(["workflow", "cancel", id]);
    expect(cancelled.stdout.trim()).toBe(`${id} cancelled`);
    const followed = await following;
    expect(followed.code).toBe(0);
    expect(followed.stdout).toMatch(/nap\s+job\s+progress\s+napping/);
    // It shows both the run's end and the end of the job the cancel stopped, whichever comes
    // last (the job's often ends after the run's), and ends with the later of the two.
    const lines = followed.stdout.trim().split("\n");
    const runEnd = lines.findIndex((l) => /workflow cancelled\s+cancelled by request/.test(l));
    const jobEnd = lines.findIndex((l) => /nap\s+job\s+cancelled/.test(l));
    expect([runEnd >= 0, jobEnd >= 0]).toEqual([true, true]);
    expect(Math.max(runEnd, jobEnd)).toBe(lines.length - 1);

    const finalJob = await client.waitForJob(job);
    expect(finalJob.state).toBe("cancelled");
    const status = await eventually(async () => {
      const text = (await ok(["workflow", "status", id])).stdout;
      return /nap\s+cancelled/.test(text) ? text : undefined;
    }, "the nap step to show cancelled");
    expect(status).toMatch(/state\s+cancelled/);
    expect(status).toMatch(/after\s+cancelled\s+-\s+the run was cancelled/);
    expect(status).toContain("error     cancelled: cancelled by request");
    // Cancelling again changes nothing and is not an error.
    expect((await ok(["workflow", "cancel", id])).stdout.trim()).toBe(`${id} cancelled`);
  });

  test("an unknown run is a clear not_found (exit 3) for status, events and cancel", async () => {
    for (const verb of ["status", "events", "cancel"]) {
      const result = await cli("workflow", verb, "wf-nothing-here");
      expect(result.code, verb).toBe(3);
      expect(result.stderr).toContain(`boxcar workflow: not_found: no workflow run wf-nothing-here`);
    }
    const usage = await cli("workflow", "frobnicate");
    expect(usage.code).toBe(2);
    expect(usage.stderr).toContain("unknown workflow command frobnicate");
  });
});

test("the Claude Code variant's agent files are valid, and call the model through the gateway with no network and no key (they are not run here: they need Claude Code and a key)", async () => {
  const folder = join(REPO, "examples/workflows/claude-code");
  for (const name of ["claude-planner.yaml", "claude-coder.yaml", "claude-reviewer.yaml"]) {
    const agent = parseAgentFile(await readFile(join(folder, name), "utf8"), name);
    expect(agent.secrets).toEqual([]);
    expect(agent.models).toEqual({ providers: ["anthropic"] });
    expect(agent.pool).toBe("claude");
    expect(agent.runtime).toMatchObject({ sandbox: "docker", network: "none" });
  }
});

// After the research example, which expects no failed run in this system.
describe("a refused handoff inside a workflow, and a reader that stops early", () => {
  test("a workflow step whose handoff is refused fails the run, and run --wait exits 1 saying why", async () => {
    await writeFiles({
      "refuser.yaml": `
name: refuser
command: |
  printf '{"summary":"tried","handoff":{"to":"nobody-declared"}}' > "$BOXCAR_RESULT_FILE"
trusted: true
runtime: { sandbox: host, timeout: 30s }
`,
      "refused.workflow.yaml": `
name: refused
steps:
  - name: only
    agent: refuser
`,
    });
    await ok(["agent", "apply", "-f", join(dir.path, "refuser.yaml")]);
    const run = await ok(["run", join(dir.path, "refused.workflow.yaml"), "--wait", "--json"], 1);
    const record = WorkflowRun.parse(JSON.parse(run.stdout));
    expect(record.state).toBe("failed");
    expect(JSON.stringify(record)).toContain("nobody-declared");
  });

  test("workflow ls pages: a page with more says on stderr how to get the next one", async () => {
    await client.applyAgent({ name: "quick", command: "true", trusted: true, runtime: { sandbox: "host" } });
    for (let i = 0; i < 2; i++) await client.startRun({ workflow: { name: "quick", steps: [{ name: "a", agent: "quick" }] } });
    const first = await ok(["workflow", "ls", "--limit", "1"]);
    const cursor = /more: boxcar workflow ls --limit 1 --after '([^']+)'/.exec(first.stderr)?.[1];
    expect(cursor, first.stderr).toBeDefined();
    const firstId = first.stdout.split("\n")[1]?.split(/\s+/)[0]; // under the header
    const second = WorkflowRun.array().parse(
      JSON.parse((await ok(["workflow", "ls", "--limit", "1", "--after", cursor as string, "--json"])).stdout),
    );
    expect(second).toHaveLength(1);
    expect(firstId).toMatch(/^wf-/);
    expect(second[0]?.id).not.toBe(firstId);
    const bad = await cli("workflow", "ls", "--after", "nonsense");
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain("after");
  });

  test("events --follow into a reader that closes its end (| head -1) ends quietly with status 0", async () => {
    await writeFiles({
      "slow.yaml": `
name: slow
command: ["sh", "-c", "sleep 2; echo done"]
trusted: true
runtime: { sandbox: host, timeout: 30s }
`,
    });
    await ok(["agent", "apply", "-f", join(dir.path, "slow.yaml")]);
    const submitted = JSON.parse((await ok(["submit", "slow", "--json"])).stdout) as { job?: { id: string }; id?: string };
    const job = { id: submitted.job?.id ?? submitted.id ?? "" };
    const follower = spawnBoxcar(nats.url, nats.topology.names.prefix, ["events", job.id, "--follow"]);
    // Like head -1: read the first line, then close the pipe while events still come.
    const first = await Promise.race([
      new Promise<boolean>((resolve) => follower.stdout?.once("data", () => resolve(true))),
      exited(follower).then(() => false),
    ]);
    expect(first, follower.output()).toBe(true);
    follower.stdout?.destroy();
    const { code } = await exited(follower);
    expect(code).toBe(0);
    expect(follower.output()).not.toMatch(/EPIPE|Error/);
    expect((await client.waitForJob(job.id)).state).toBe("succeeded");
  });
});
