/**
 * The web dashboard in a real browser (Debian's Chromium, headless, driven by playwright-core)
 * against a real system started as a new user would, `boxcar up`: jobs appear live, output
 * streams in, an artifact downloads, cancel stops a running job, a workflow's graph shows its
 * steps' states, dead letters are retried in bulk, a job's model calls fill their table live, a
 * prompt agent's conversation grows live, its tool calls opened to their arguments and results.
 * Each main page is saved as a screenshot under
 * `.boxcar/screenshots/` for a person to look at.
 */

import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type BoxcarClient, connectNats, resolveConnection } from "@boxcar/client";
import { openTopology } from "@boxcar/fabric";
import { eventually, scratch } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import type { Locator } from "playwright-core";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { browserPath, SCREENSHOTS } from "./helpers/browser.js";
import { type UpDashboard, upDashboard } from "./helpers/dashboard.js";
import { type ModelStandIn, startModelStandIn } from "./helpers/model-standin.js";
import type { UpProcess } from "./helpers/up.js";

const chromiumPath = browserPath();

describe.skipIf(!chromiumPath)("the dashboard of boxcar up, in Chromium", () => {
  let ui: UpDashboard;
  let up: UpProcess;
  let dashboard: string;
  let client: BoxcarClient;

  beforeAll(async () => {
    ui = await upDashboard("dashboard-test", chromiumPath as string);
    ({ up, url: dashboard, client } = ui);
    await client.applyAgent({
      name: "ticker",
      description: "prints a numbered line every 100 ms, as many as its input says, then writes two files",
      command: [
        "node",
        "-e",
        `const fs = require("node:fs");
         const n = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8")).lines;
         let i = 0;
         const tick = setInterval(() => {
           console.log("tick " + ++i + (i === 1 ? " <img src=x onerror=document.title='pwned'>" : ""));
           if (i < n) return;
           clearInterval(tick);
           fs.writeFileSync(process.env.BOXCAR_OUTPUT_DIR + "/numbers.txt", Array.from({ length: n }, (_, k) => k + 1).join("\\n"));
           fs.writeFileSync(process.env.BOXCAR_OUTPUT_DIR + "/page.html", "<script>document.title='pwned'</script>");
           fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: { lines: n }, summary: n + " ticks" }));
         }, 100);`,
      ],
      trusted: true,
      runtime: { sandbox: "host", timeout: "2m" },
    });
    await client.applyAgent({
      name: "doomed",
      description: "always fails, and is retried once at once: its jobs end dead",
      command: ["sh", "-c", "printf '\\033[31mgiving up\\033[0m\\n' >&2; exit 1"],
      trusted: true,
      runtime: { sandbox: "host", timeout: "30s" },
      retry: { maxAttempts: 2, delay: 0, backoff: "fixed", jitter: false },
    });
  }, 60_000);

  afterAll(async () => {
    await ui?.[Symbol.asyncDispose]();
  });

  const open = (path?: string) => ui.open(path);

  /**
   * A worker of this process serving the pool `models`, with a model gateway in front of the
   * stand-in provider: `boxcar up`'s workers hold no provider key (as gateway.test.ts's systems do).
   */
  async function gatewayWorker(standIn: ModelStandIn): Promise<AsyncDisposable> {
    const workerNc = await connectNats(
      resolveConnection({ flags: { nats: `nats://127.0.0.1:${up.port}` }, env: {} }),
      "dashboard-test-models",
    );
    const worker = createWorker({
      topology: await openTopology(workerNc),
      pools: ["models"],
      providers: [createHostSandboxProvider()],
      modelGateway: {
        providers: {
          anthropic: { key: "sk-ant-dashboard-test", baseUrl: standIn.anthropicUrl },
          openai: { key: "sk-proj-dashboard-test", baseUrl: standIn.openaiUrl },
        },
      },
    });
    void worker.run();
    return {
      [Symbol.asyncDispose]: async () => {
        await worker.close();
        await workerNc.close();
      },
    };
  }

  test("a submitted job appears on the jobs page live and reaches succeeded there", async () => {
    const page = await open("#/jobs");
    await page.locator("text=2 jobs").or(page.locator(".total")).first().waitFor();
    const { job } = await client.submit({ agent: "ticker", input: { lines: 15 } });
    const row = page.locator(`tr[data-job="${job.id}"]`);
    // The page was loaded before the job existed: it shows it without a reload.
    await row.waitFor({ timeout: 10_000 });
    await row.locator('[data-state="succeeded"]').waitFor({ timeout: 20_000 });
    expect(await client.getJob(job.id)).toMatchObject({ state: "succeeded" });
    await page.screenshot({ path: `${SCREENSHOTS}/jobs.png` });
    await page.close();
  }, 40_000);

  test("a running job's page streams its output, shows its timeline and result, and downloads an artifact", async () => {
    const { job } = await client.submit({ agent: "ticker", input: { lines: 40 } });
    const page = await open(`#/job/${job.id}`);
    const output = page.locator("[data-output]");
    // Lines arrive while the job runs: a middle line is seen before the job has ended.
    await expect.poll(async () => /tick 1[0-9]/.test((await output.textContent()) ?? ""), { timeout: 15_000 }).toBe(true);
    expect((await client.getJob(job.id)).state).toBe("running");
    await page.locator('h1 [data-state="succeeded"]').waitFor({ timeout: 20_000 });
    const text = (await output.textContent()) ?? "";
    // Every line once, in order, though some came live and some from the store.
    const ticks = text.split("\n").flatMap((line) => /^tick (\d+)/.exec(line)?.[1] ?? []);
    expect(ticks).toEqual(Array.from({ length: 40 }, (_, k) => String(k + 1)));
    // Output is text: markup an agent prints is shown, never run.
    expect(text).toContain("<img src=x onerror=document.title='pwned'>");
    expect(await page.locator("[data-output] img").count()).toBe(0);
    await expect.poll(() => page.locator('[data-event="job.succeeded"]').count()).toBe(1);
    expect(await page.locator('[data-event="sandbox.exec_exited"]').count()).toBe(1);
    expect(await page.locator("[data-summary]").textContent()).toBe("40 ticks");
    // A job that called no model has no table of model calls.
    expect(await page.locator("[data-model-calls]").count()).toBe(0);

    const [download] = await Promise.all([page.waitForEvent("download"), page.locator('[data-artifact="out/numbers.txt"]').click()]);
    expect(download.suggestedFilename()).toBe("numbers.txt");
    expect(await readFile(await download.path(), "utf8")).toBe(Array.from({ length: 40 }, (_, k) => k + 1).join("\n"));
    // An HTML artifact is downloaded as a file too, never opened in the dashboard's origin.
    const [html] = await Promise.all([page.waitForEvent("download"), page.locator('[data-artifact="out/page.html"]').click()]);
    expect(await readFile(await html.path(), "utf8")).toContain("<script>");
    expect(await page.title()).toBe("Boxcar");
    await page.screenshot({ path: `${SCREENSHOTS}/job.png`, fullPage: true });
    await page.close();
  }, 60_000);

  test("cancel on a running job's page stops it", async () => {
    const { job } = await client.submit({ agent: "ticker", input: { lines: 600 } });
    const page = await open(`#/job/${job.id}`);
    await expect
      .poll(async () => ((await page.locator("[data-output]").textContent()) ?? "").includes("tick 3"), { timeout: 15_000 })
      .toBe(true);
    await page.locator('[data-action="cancel"]').click();
    await page.locator('h1 [data-state="cancelled"]').waitFor({ timeout: 20_000 });
    const ended = await client.getJob(job.id);
    expect(ended.state).toBe("cancelled");
    // It stopped long before its 600 ticks (a minute).
    expect(Date.parse(ended.finishedAt as string) - Date.parse(ended.startedAt as string)).toBeLessThan(30_000);
    expect(await page.locator('[data-action="cancel"]').count()).toBe(0);
    await page.close();
  }, 40_000);

  test("a workflow run's page draws its steps and their states live", async () => {
    const page = await open("#/runs");
    const { run } = await client.startRun({
      workflow: {
        name: "fan",
        steps: [
          { name: "plan", agent: "ticker", input: { lines: 5 } },
          { name: "left", agent: "ticker", needs: ["plan"], input: { lines: 20 } },
          { name: "right", agent: "ticker", needs: ["plan"], input: { lines: 3 } },
          { name: "join", agent: "ticker", needs: ["left", "right"], input: { lines: 1 } },
        ],
      },
    });
    await page.locator(`tr[data-run="${run.id}"]`).waitFor({ timeout: 10_000 });
    await page.locator(`tr[data-run="${run.id}"] a`).click();
    const node = (step: string) => page.locator(`[data-dag] [data-node="${step}"]`);
    // Seen running on the graph, then every step succeeded, without a reload.
    await node("left").and(page.locator('[data-state="running"]')).waitFor({ timeout: 20_000 });
    for (const step of ["plan", "left", "right", "join"]) {
      await node(step).and(page.locator('[data-state="succeeded"]')).waitFor({ timeout: 30_000 });
    }
    expect(await page.locator("[data-dag] path.edge").count()).toBe(4);
    await page.locator('h1 [data-state="succeeded"]').waitFor();
    await page.screenshot({ path: `${SCREENSHOTS}/workflow.png`, fullPage: true });
    await page.goto(`${dashboard}/#/runs`);
    await page.locator(`tr[data-run="${run.id}"]`).waitFor();
    await page.screenshot({ path: `${SCREENSHOTS}/runs.png` });
    await page.close();
  }, 60_000);

  test("an approval step waits on its run's page, and Approve there with a comment lets the run go on", async () => {
    const { run } = await client.startRun({
      workflow: {
        name: "signed",
        steps: [
          { name: "sign-off", approval: { timeout: "10m", message: "Ship the report?" } },
          { name: "ship", agent: "ticker", needs: ["sign-off"], input: { lines: 1, by: "{{ steps.sign-off.output.by }}" } },
        ],
      },
    });
    const page = await open(`#/run/${run.id}`);
    const approval = page.locator('[data-approval="sign-off"]');
    await approval.and(page.locator('[data-decision="waiting"]')).waitFor({ timeout: 10_000 });
    expect(await approval.textContent()).toContain("Ship the report?");
    expect(await approval.textContent()).toContain("local (the run's owner)");
    await page.screenshot({ path: `${SCREENSHOTS}/approval.png`, fullPage: true });
    await approval.locator("[data-comment]").fill("looks right");
    await approval.locator('[data-action="approve"]').click();
    await approval.and(page.locator('[data-decision="approved"]')).waitFor({ timeout: 10_000 });
    expect(await approval.textContent()).toContain("approved by local");
    await page.locator('h1 [data-state="succeeded"]').waitFor({ timeout: 30_000 });
    const done = await client.getRun(run.id);
    expect(done.steps["sign-off"]?.approval).toMatchObject({ decision: "approved", by: "local", comment: "looks right" });
    expect(await approval.locator('[data-action="approve"]').count()).toBe(0);
    await page.close();
  }, 60_000);

  test("dead letters are retried in bulk from the page", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await client.submit({ agent: "doomed", input: null })).job.id);
    for (const id of ids) await eventually(async () => ((await client.getJob(id)).state === "dead" ? true : undefined), `${id} to die`);
    const page = await open("#/dead");
    for (const id of ids) await page.locator(`tr[data-job="${id}"]`).waitFor();
    await page.screenshot({ path: `${SCREENSHOTS}/dead.png` });
    for (const id of ids) await page.locator(`tr[data-job="${id}"] input[type=checkbox]`).check();
    await page.locator('[data-action="retry-selected"]').click();
    await page.locator("[data-outcome] li").nth(2).waitFor();
    const outcome = (await page.locator("[data-outcome]").textContent()) ?? "";
    for (const id of ids) expect(outcome).toContain(`${id}: queued`);
    // Each went round again with a fresh budget of two attempts, and died again (the agent always fails).
    for (const id of ids) {
      await eventually(async () => {
        const job = await client.getJob(id);
        return job.state === "dead" && job.attempt === 4 ? true : undefined;
      }, `${id} to run two more attempts`);
    }
    await page.close();
  }, 60_000);

  test("Retry on a dead job's page runs it again, and the page follows the new attempts live", async () => {
    const { job } = await client.submit({ agent: "doomed", input: null });
    await eventually(async () => ((await client.getJob(job.id)).state === "dead" ? true : undefined), `${job.id} to die`);
    const page = await open(`#/job/${job.id}`);
    await page.locator('h1 [data-state="dead"]').waitFor();
    await expect.poll(() => page.locator('[data-event="job.dead"]').count()).toBe(1);
    await page.locator('[data-action="retry"]').click();
    // Ended, then queued again, then dead again after two more attempts: all seen on the open page.
    await expect.poll(() => page.locator('[data-event="job.dead"]').count(), { timeout: 20_000 }).toBe(2);
    await page.locator('h1 [data-state="dead"]').waitFor();
    await expect.poll(() => page.locator('[data-event="job.started"]').count()).toBe(4);
    // stderr is set apart, its terminal colour codes dropped.
    const stderr = (await page.locator("[data-output] .stderr").first().textContent()) ?? "";
    expect(stderr).toContain("giving up");
    expect(stderr).not.toContain("\u001b");
    expect(stderr).not.toContain("[31m");
    await page.close();
  }, 40_000);

  test("a malformed address shows a not-found job, and the filters follow the address", async () => {
    const page = await open("#/job/%zz");
    await page.locator("main .error").waitFor();
    await page.goto(`${dashboard}/#/jobs?agent=doomed`);
    await expect.poll(() => page.locator('input[name="agent"]').inputValue()).toBe("doomed");
    await page.locator("header a", { hasText: "Jobs" }).click();
    await expect.poll(() => page.locator('input[name="agent"]').inputValue()).toBe("");
    await page.close();
  }, 30_000);

  test("the agents page lists the applied agents and links to their jobs", async () => {
    const page = await open("#/agents");
    await page.locator('tr[data-agent="ticker"]').waitFor();
    expect(await page.locator('tr[data-agent="doomed"]').textContent()).toContain("up to 2 attempts");
    await page.screenshot({ path: `${SCREENSHOTS}/agents.png` });
    await page.locator('tr[data-agent="doomed"] a').click();
    await expect.poll(() => page.locator('input[name="agent"]').inputValue()).toBe("doomed");
    await page.close();
  }, 30_000);

  test("the usage page shows the day's usage per agent and user, and a job's page its own", async () => {
    await client.applyAgent({
      name: "spender",
      command: ["sh", "-c", 'echo \'{"model":"m","tokensIn":120,"tokensOut":30,"cost":0.5}\' >> "$BOXCAR_USAGE_FILE"'],
      trusted: true,
      runtime: { sandbox: "host" },
    });
    const { job } = await client.submit({ agent: "spender" });
    expect((await client.waitForJob(job.id)).usage).toMatchObject({ calls: 1, cost: 0.5 });
    const page = await open("#/usage");
    await expect
      .poll(
        async () =>
          (await page
            .locator('tr[data-usage="agent:spender"]')
            .textContent({ timeout: 1_000 })
            .catch(() => "")) ?? "",
        {
          timeout: 15_000,
        },
      )
      .toMatch(/spender\s*1\s*120\s*30\s*0\.5/);
    await page.screenshot({ path: `${SCREENSHOTS}/usage.png` });
    await page.goto(`${dashboard}/#/job/${job.id}`);
    expect(await page.locator("dd[data-usage]").textContent()).toBe("1 calls: 120 tokens in, 30 out, cost 0.5");
    await page.close();
  }, 30_000);

  test("the workers page shows each worker's load and sandboxes", async () => {
    const page = await open("#/workers");
    await expect.poll(() => page.locator("table.workers tbody tr").count(), { timeout: 10_000 }).toBe(2);
    expect(await page.locator('table.workers [data-state="live"]').count()).toBe(2);
    expect(await page.locator("table.workers").textContent()).toContain("host");
    await page.screenshot({ path: `${SCREENSHOTS}/workers.png` });
    await page.close();
  }, 30_000);

  // Last two: their workers, stopped at the end, would be more rows on the workers page.
  test("a job's model calls fill a table on its page live: attempt, provider, model, status, tokens, cost, ms, streamed, replayed, and their totals", async () => {
    await using standIn = await startModelStandIn();
    await using folder = await scratch("boxcar-model-calls-");
    const go = join(folder.path, "go");
    await using _worker = await gatewayWorker(standIn);
    try {
      await client.setPolicy({
        prices: { "claude-test": { in: 3, out: 15, cacheRead: 0.3, cacheWrite: 3.75 }, "gpt-test": { in: 1, out: 2 } },
      });
      // One Anthropic call; then, once the test says so, two OpenAI calls (plain, streamed).
      await client.applyAgent({
        name: "caller",
        description: "calls Anthropic once, waits for its go file, then calls OpenAI twice, through its worker's gateway",
        pool: "models",
        command: [
          "node",
          "-e",
          `const fs = require("node:fs");
           const { go } = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8"));
           const post = async (url, headers, body) => {
             const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
             const text = await res.text();
             if (!res.ok) throw new Error(res.status + " " + text);
           };
           const openai = (body) => post(process.env.OPENAI_BASE_URL + "/chat/completions", { authorization: "Bearer " + process.env.OPENAI_API_KEY }, body);
           (async () => {
             await post(process.env.ANTHROPIC_BASE_URL + "/v1/messages", { "x-api-key": process.env.ANTHROPIC_API_KEY, "anthropic-version": "2023-06-01" },
               { model: "claude-test", max_tokens: 16, messages: [{ role: "user", content: "hi" }] });
             while (!fs.existsSync(go)) await new Promise((r) => setTimeout(r, 50));
             await openai({ model: "gpt-test", messages: [{ role: "user", content: "hi" }] });
             await openai({ model: "gpt-test", messages: [{ role: "user", content: "hi" }], stream: true });
             fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: { calls: 3 } }));
           })().catch((e) => { console.error(e); process.exit(1); });`,
        ],
        trusted: true,
        runtime: { sandbox: "host", timeout: "1m" },
        models: { providers: ["anthropic", "openai"] },
      });
      const { job } = await client.submit({ agent: "caller", input: { go } });
      const page = await open(`#/job/${job.id}`);
      const table = page.locator("table[data-model-calls]");
      const rows = table.locator("tbody tr");
      const cells = async (row: Locator) => (await row.locator("td, th").allTextContents()).map((t) => t.trim());
      // The first call shows while the job runs (the agent waits for its go file).
      await rows.first().waitFor({ timeout: 20_000 });
      expect((await client.getJob(job.id)).state).toBe("running");
      expect(await cells(table.locator("thead tr"))).toEqual([
        "attempt",
        "provider",
        "model",
        "status",
        "tokens in",
        "tokens out",
        "cost",
        "ms",
        "streamed",
        "replayed",
      ]);
      expect(await rows.count()).toBe(1);
      // Anthropic's tokens in: 11 + 3 read from its cache + 2 written to it; its cost by the prices above,
      // (11 x 3 + 3 x 0.3 + 2 x 3.75 + 7 x 15) / 1e6. OpenAI's: 11 (its cached 3 among them), (11 x 1 + 7 x 2) / 1e6.
      const anthropicRow = ["1", "anthropic", "claude-test", "200", "16", "7", "0.0001464"];
      const openaiRow = ["1", "openai", "gpt-test", "200", "11", "7", "0.000025"];
      const first = await cells(rows.nth(0));
      expect(first.slice(0, 7)).toEqual(anthropicRow);
      expect(first[7]).toMatch(/^\d+$/);
      expect(first.slice(8)).toEqual(["no", "no"]);
      expect(await cells(table.locator("[data-model-calls-total]"))).toEqual(["1 call", "16", "7", "0.0001464", ""]);
      // The next two arrive on the open page, without a reload.
      await writeFile(go, "");
      await expect.poll(() => rows.count(), { timeout: 20_000 }).toBe(3);
      const all = await Promise.all([0, 1, 2].map((i) => cells(rows.nth(i))));
      expect(all.map((row) => row.slice(0, 7))).toEqual([anthropicRow, openaiRow, openaiRow]);
      expect(all.map((row) => row.slice(8))).toEqual([
        ["no", "no"],
        ["no", "no"],
        ["yes", "no"],
      ]);
      await expect.poll(() => cells(table.locator("[data-model-calls-total]"))).toEqual(["3 calls", "38", "21", "0.0001964", ""]);
      await page.locator('h1 [data-state="succeeded"]').waitFor({ timeout: 20_000 });
      // The job's usage, summed by the dispatchers, agrees (its cost as the table writes it, not 0.00019640000000000003).
      await expect.poll(() => page.locator("dd[data-usage]").textContent()).toBe("3 calls: 38 tokens in, 21 out, cost 0.0001964");
      // The table says what the job's events say.
      const stored = [];
      for await (const e of client.events(job.id)) {
        if (e.kind === "job" && e.type === "model_call")
          stored.push([e.call?.provider, e.call?.model, String(e.call?.tokensIn), String(e.call?.tokensOut)]);
      }
      expect(all.map((row) => row.slice(1, 3).concat(row.slice(4, 6)))).toEqual(stored);
      expect(await rows.count()).toBe(3);
      await page.screenshot({ path: `${SCREENSHOTS}/model-calls.png`, fullPage: true });
      await page.close();
    } finally {
      await writeFile(go, "").catch(() => {});
    }
  }, 60_000);

  test("a prompt agent's conversation shows on its job's page live: each step's model turn, its tool calls collapsed, opened to their arguments and results", async () => {
    await using standIn = await startModelStandIn();
    await using folder = await scratch("boxcar-conversation-");
    const go = join(folder.path, "go");
    await using _worker = await gatewayWorker(standIn);
    try {
      await client.applyAgent({
        name: "talker",
        description: "a prompt agent: one bash call, then its answer",
        pool: "models",
        prompt: { model: "anthropic/claude-test", template: "Say hi.", tools: ["bash"] },
        runtime: { sandbox: "host" },
        trusted: true,
      });
      // Its bash waits for the go file, so the page shows the call running before its result and
      // the next step come; what it prints carries markup, which must stay text.
      const command = `until [ -e '${go}' ]; do sleep 0.05; done; echo "hi <img src=x onerror=document.title='pwned'>"`;
      standIn.script({ kind: "answer", tool: "bash", input: { command }, id: "t1" }, { kind: "answer", text: "done" });
      const { job } = await client.submit({ agent: "talker" });
      const page = await open(`#/job/${job.id}`);
      const steps = page.locator("[data-conversation] [data-step]");
      const call = steps.nth(0).locator('[data-tool-call="bash"]');
      await call.locator("[data-tool-status]", { hasText: "running…" }).waitFor({ timeout: 20_000 });
      expect(await steps.count()).toBe(1);
      expect(await steps.nth(0).locator("[data-finish]").textContent()).toBe("tool-calls");
      expect(await steps.nth(0).locator("[data-step-text]").count()).toBe(0);
      // Collapsed: the tool's name and a line of its arguments, not the arguments in full.
      expect(await call.locator("summary code").textContent()).toBe("bash");
      const preview = (await call.locator("[data-tool-preview]").textContent()) ?? "";
      expect(preview).toMatch(/^\{"command":"until \[ -e /);
      expect(JSON.stringify({ command }).startsWith(preview.replace(/…$/, ""))).toBe(true);
      expect(await call.locator("[data-tool-input]").isVisible()).toBe(false);
      // The result and the second step arrive on the open page, without a reload.
      await writeFile(go, "");
      await expect.poll(() => steps.count(), { timeout: 20_000 }).toBe(2);
      await expect.poll(() => call.locator("[data-tool-status]").textContent()).toMatch(/^done in \d+ ms$/);
      await call.locator("summary").click();
      const input = call.locator("[data-tool-input]");
      await input.waitFor({ state: "visible" });
      expect(await input.textContent()).toBe(JSON.stringify({ command }, null, 2));
      const output = call.locator("[data-tool-output]");
      expect(await output.isVisible()).toBe(true);
      expect(await output.textContent()).toContain("hi <img src=x onerror=document.title='pwned'>");
      expect(await output.getAttribute("data-tool-error")).toBeNull();
      expect(await steps.nth(1).locator("[data-finish]").textContent()).toBe("stop");
      expect(await steps.nth(1).locator("[data-step-text]").textContent()).toBe("done");
      expect(await steps.nth(1).locator("[data-tool-call]").count()).toBe(0);
      expect(await page.locator("[data-conversation] img").count()).toBe(0);
      expect(await page.title()).not.toBe("pwned");
      await page.locator('h1 [data-state="succeeded"]').waitFor({ timeout: 20_000 });
      expect((await client.getJob(job.id)).result?.output).toMatchObject({ text: "done", steps: 2 });
      // The opened call stays open as the page goes on drawing the job's events.
      expect(await input.isVisible()).toBe(true);
      await page.screenshot({ path: `${SCREENSHOTS}/conversation.png`, fullPage: true });
      await page.close();
    } finally {
      await writeFile(go, "").catch(() => {});
    }
  }, 60_000);
});
