/**
 * What the dashboard shows of a job and a run beyond their state (issue 43), in a real browser
 * (Debian's Chromium, headless) against `boxcar up`: a job's input (cut on the page, downloaded
 * whole), labels and trace id (linked to a tracing UI); each attempt's timeline (queue wait,
 * sandbox start, run, copy-out) and each workflow step's; dates, durations that tick while a job
 * runs; terminal colours shown as colours; no empty Result heading on a failed job; the search
 * box (an id opens its page; filters by agent, state and owner); paging back and forth; a time
 * range; Retry of a failed job and Re-run of a succeeded one with an edited input. Screenshots go
 * to `.boxcar/screenshots/` (the docs' are copies).
 */

import { readFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import type { BoxcarClient } from "@boxcar/client";
import { openTopology } from "@boxcar/fabric";
import { type JobRecord, names } from "@boxcar/protocol";
import { eventually } from "@boxcar/testing";
import { type NatsConnection, headers as natsHeaders } from "@nats-io/transport-node";
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { browserPath, SCREENSHOTS } from "./helpers/browser.js";
import { type UpDashboard, upDashboard } from "./helpers/dashboard.js";

// The page's own globals, in functions Playwright runs in the browser (this project has no DOM types).
declare const getComputedStyle: (element: unknown) => { color: string; fontWeight: string };
declare const location: { hash: string };
declare const scrollTo: (x: number, y: number) => void;

const chromiumPath = browserPath();
const TRACE_UI = "http://traces.example/trace/{traceId}";

describe.skipIf(!chromiumPath)("a job's and a run's pages, search and paging on the dashboard, in Chromium", () => {
  let ui: UpDashboard;
  let dashboard: string;
  let nc: NatsConnection;
  let client: BoxcarClient;

  beforeAll(async () => {
    // `boxcar up` serves the dashboard; its tracing UI comes from the environment.
    ui = await upDashboard("dashboard-views-test", chromiumPath as string, { BOXCAR_TRACE_URL: TRACE_UI });
    ({ url: dashboard, nc, client } = ui);
    await client.applyAgent({
      name: "ticker",
      description: "prints a line every 100 ms, as many as its input says, then writes a file",
      command: [
        "node",
        "-e",
        `const fs = require("node:fs");
         const n = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8")).lines;
         let i = 0;
         const tick = setInterval(() => {
           console.log("tick " + ++i);
           if (i < n) return;
           clearInterval(tick);
           fs.writeFileSync(process.env.BOXCAR_OUTPUT_DIR + "/ticks.txt", String(n));
           fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: { lines: n }, summary: n + " ticks" }));
         }, 100);`,
      ],
      trusted: true,
      runtime: { sandbox: "host", timeout: "2m" },
    });
    await client.applyAgent({
      name: "flaky",
      description: "fails its first attempt, runs half a second on its second and succeeds",
      command: ["sh", "-c", 'sleep 0.5; [ "$BOXCAR_ATTEMPT" != 1 ] || exit 1; echo ok > "$BOXCAR_OUTPUT_DIR/ok.txt"'],
      trusted: true,
      runtime: { sandbox: "host", timeout: "30s" },
      retry: { maxAttempts: 2, delay: 0, backoff: "fixed", jitter: false },
    });
    await client.applyAgent({
      name: "colours",
      description: "prints in colour, markup too, then fails",
      command: [
        "sh",
        "-c",
        "printf '\\033[31mred\\033[0m plain \\033[1;32mbold green\\033[0m \\033[38;5;208morange\\033[0m <b>not bold</b>\\n'; printf '\\033[33mwarn\\033[0m\\n' >&2; exit 3",
      ],
      trusted: true,
      runtime: { sandbox: "host", timeout: "30s" },
    });
    await client.applyAgent({
      name: "doubler",
      description: "doubles its input's n; fails its first attempt when its input says failFirst",
      command: [
        "node",
        "-e",
        `const fs = require("node:fs");
         const input = JSON.parse(fs.readFileSync(process.env.BOXCAR_INPUT_FILE, "utf8"));
         if (input.failFirst && process.env.BOXCAR_ATTEMPT === "1") process.exit(3);
         fs.writeFileSync(process.env.BOXCAR_RESULT_FILE, JSON.stringify({ output: { doubled: input.n * 2 } }));`,
      ],
      trusted: true,
      runtime: { sandbox: "host", timeout: "30s" },
    });
    // Jobs of a pool no worker serves: they wait, queued, as many as a test needs.
    for (const name of ["parked", "pager"]) {
      await client.applyAgent({ name, pool: "parked", command: ["true"], trusted: true, runtime: { sandbox: "host" } });
    }
  }, 60_000);

  afterAll(async () => {
    await ui?.[Symbol.asyncDispose]();
  });

  const open = (path?: string, sent?: string[]) => ui.open(path, sent);

  const settled = (id: string, state: string) =>
    eventually(async () => ((await client.getJob(id)).state === state ? true : undefined), `${id} to be ${state}`, 30_000);

  /** The `data-*` numbers of each phase of one bar of a page's timeline, in order. */
  async function phases(page: Page, kind: string, bar: string) {
    return page.locator(`[data-gantt="${kind}"] [data-bar="${bar}"] .gantt-seg`).evaluateAll((els) =>
      els.map((el) => ({
        phase: el.getAttribute("data-phase") ?? "",
        from: Number(el.getAttribute("data-from")),
        to: Number(el.getAttribute("data-to")),
        ms: Number(el.getAttribute("data-ms")),
        live: el.classList.contains("live"),
      })),
    );
  }

  test("a job's page shows its input (its first 64 KiB, downloaded whole), its labels, and its trace id linked to the tracing UI", async () => {
    const input = { items: Array.from({ length: 3000 }, (_, i) => `item ${i} ${"x".repeat(24)}`) };
    const traceId = "4bf92f3577b34da6a3ce929d0e0e4736";
    // A submit in a trace of its caller's: the job's record joins it.
    const headers = natsHeaders();
    headers.set("traceparent", `00-${traceId}-00f067aa0ba902b7-01`);
    const reply = await nc.request(
      names().subjects.api({ role: "admin", user: "local" }, "jobs.submit"),
      JSON.stringify({ agent: "parked", input, labels: { team: "search", ticket: "BOX-43" } }),
      { headers, timeout: 10_000 },
    );
    const { job } = (JSON.parse(new TextDecoder().decode(reply.data)) as { data: { job: JobRecord } }).data;
    expect(job.traceparent?.split("-")[1]).toBe(traceId);

    const page = await open(`#/job/${job.id}`);
    const shown = page.locator("[data-input]");
    await shown.waitFor();
    const text = (await shown.textContent()) ?? "";
    const whole = JSON.stringify(input, null, 2);
    expect(whole.length).toBeGreaterThan(100_000);
    expect(text).toBe(whole.slice(0, 64 * 1024));
    expect(await page.locator("[data-input-cut]").textContent()).toContain("the download has all of it");
    const [download] = await Promise.all([page.waitForEvent("download"), page.locator("[data-input-download]").click()]);
    expect(download.suggestedFilename()).toBe(`${job.id}-input.json`);
    expect(JSON.parse(await readFile(await download.path(), "utf8"))).toEqual(input);

    expect(await page.locator("[data-labels] [data-label]").allTextContents()).toEqual(["team=search", "ticket=BOX-43"]);
    const trace = page.locator(`a[data-trace="${traceId}"]`);
    expect(await trace.getAttribute("href")).toBe(`http://traces.example/trace/${traceId}`);
    expect(await trace.getAttribute("target")).toBe("_blank");
    expect(await trace.getAttribute("rel")).toBe("noopener noreferrer");
    // Not started (no worker serves its pool): its timeline is its wait, growing.
    await expect.poll(async () => (await phases(page, "attempt", "attempt-1")).map((p) => [p.phase, p.live])).toEqual([["queue", true]]);
    await page.close();
  }, 30_000);

  test("a job's page draws each attempt's queue wait, sandbox start, run and copy-out on one time axis", async () => {
    const { job } = await client.submit({ agent: "flaky" });
    await settled(job.id, "succeeded");
    const page = await open(`#/job/${job.id}`);
    const bars = page.locator('[data-gantt="attempt"] [data-bar]');
    await expect.poll(() => bars.count()).toBe(2);
    expect(await page.locator('[data-bar="attempt-1"]').getAttribute("data-outcome")).toBe("retrying");
    expect(await page.locator('[data-bar="attempt-2"]').getAttribute("data-outcome")).toBe("succeeded");
    const first = await phases(page, "attempt", "attempt-1");
    const second = await phases(page, "attempt", "attempt-2");
    for (const attempt of [first, second]) {
      expect(attempt.map((p) => p.phase)).toEqual(["queue", "start", "run", "copy"]);
      // Each phase ends where the next begins, none is running.
      for (let i = 1; i < attempt.length; i++) expect(attempt[i]?.from).toBe(attempt[i - 1]?.to);
      expect(attempt.every((p) => !p.live)).toBe(true);
    }
    // The second attempt waited from the first's end; both ran their half second.
    expect(second[0]?.from).toBe(first.at(-1)?.to);
    for (const attempt of [first, second]) expect(attempt[2]?.ms).toBeGreaterThanOrEqual(450);
    // Each run is from its sandbox's exec_started to its exec_exited, as the job's events say.
    const execs = new Map<string, number>();
    for await (const e of client.events(job.id)) if (e.kind === "sandbox") execs.set(`${e.type} ${e.attempt}`, Date.parse(e.at));
    for (const [i, attempt] of [first, second].entries()) {
      const ran = (execs.get(`exec_exited ${i + 1}`) ?? 0) - (execs.get(`exec_started ${i + 1}`) ?? 0);
      expect(Math.abs((attempt[2]?.ms ?? 0) - ran)).toBeLessThanOrEqual(1);
    }
    const detail = (await page.locator('[data-bar="attempt-2"] .gantt-detail').textContent()) ?? "";
    expect(detail).toMatch(/^queue wait \d+ ms\s*sandbox start \d+ ms\s*run (\d+ ms|\d\.\d s)\s*copy-out \d+ ms\s*succeeded$/);
    await page.locator('[data-gantt="attempt"]').scrollIntoViewIfNeeded();
    await page.screenshot({ path: `${SCREENSHOTS}/job-timeline.png`, fullPage: true });
    await page.close();
  }, 40_000);

  test("a running job's durations tick, on its page, in its timeline and in the list, and the list shows dates", async () => {
    const { job } = await client.submit({ agent: "ticker", input: { lines: 50 } });
    const page = await open("#/jobs?agent=ticker");
    const row = page.locator(`tr[data-job="${job.id}"]`);
    await row.locator('[data-state="running"]').waitFor({ timeout: 15_000 });
    const took = row.locator("[data-took]");
    const listed = async () => {
      const text = (await took.textContent()) ?? "";
      return text.endsWith(" ms") ? Number.parseFloat(text) : Number.parseFloat(text) * 1000;
    };
    const a = await listed();
    // No event comes in between (a running job's progress changes no list): the cell ticks by itself.
    await expect.poll(listed, { timeout: 3_000 }).toBeGreaterThan(a + 900);
    const today = await page.evaluate(() => {
      const t = new Date();
      return `${t.getFullYear()}-${String(t.getMonth() + 1).padStart(2, "0")}-${String(t.getDate()).padStart(2, "0")}`;
    });
    expect(await row.locator("[data-created]").textContent()).toMatch(new RegExp(`^${today} \\d{2}:\\d{2}:\\d{2}$`));

    await page.goto(`${dashboard}/#/job/${job.id}`);
    const ran = page.locator("[data-ran] [data-took]");
    await ran.waitFor();
    const ms = async () => {
      const text = (await ran.textContent()) ?? "";
      return text.endsWith(" ms") ? Number.parseFloat(text) : Number.parseFloat(text) * 1000;
    };
    const b = await ms();
    await expect.poll(ms, { timeout: 3_000 }).toBeGreaterThan(b + 900);
    expect(await page.locator("[data-created]").textContent()).toMatch(new RegExp(`^${today} `));
    const run = async () => (await phases(page, "attempt", "attempt-1")).find((p) => p.phase === "run");
    await expect.poll(async () => (await run())?.live).toBe(true);
    const c = (await run())?.ms ?? 0;
    await expect.poll(async () => (await run())?.ms ?? 0, { timeout: 3_000 }).toBeGreaterThan(c + 900);
    await page.locator('h1 [data-state="succeeded"]').waitFor({ timeout: 20_000 });
    // Ended: it stops where the job did.
    await expect.poll(async () => (await run())?.live).toBe(false);
    await page.close();
  }, 40_000);

  test("a failed job's output shows its terminal colours as coloured text, and its page has no empty Result", async () => {
    const { job } = await client.submit({ agent: "colours" });
    await settled(job.id, "failed");
    const page = await open(`#/job/${job.id}`);
    const output = page.locator("[data-output]");
    await output.locator(".ansi-fg-red").waitFor();
    expect(await output.locator(".ansi-fg-red").textContent()).toBe("red");
    expect(await output.locator(".ansi-fg-red").evaluate((el) => getComputedStyle(el).color)).toBe("rgb(248, 113, 113)");
    const bold = output.locator(".ansi-fg-green.ansi-bold");
    expect(await bold.textContent()).toBe("bold green");
    expect(await bold.evaluate((el) => getComputedStyle(el).fontWeight)).toBe("700");
    // A 256-colour code: its colour set through the style object, not a class.
    const orange = output.locator("span", { hasText: /^orange$/ });
    expect(await orange.evaluate((el) => getComputedStyle(el).color)).toBe("rgb(255, 135, 0)");
    expect(await output.locator(".stderr .ansi-fg-yellow").textContent()).toBe("warn");
    const text = (await output.textContent()) ?? "";
    expect(text).toContain("red plain bold green orange <b>not bold</b>");
    expect(text).not.toContain("\u001b");
    expect(text).not.toContain("[0m");
    // Markup it prints in colour stays text.
    expect(await output.locator("b").count()).toBe(0);
    // Failed, with nothing to show for a result: no Result heading, the error and how it exited instead.
    await page.locator("[data-error]").waitFor();
    expect(await page.locator("h2", { hasText: "Result" }).count()).toBe(0);
    expect(await page.locator("[data-exit]").textContent()).toBe("exit 3");
    await page.screenshot({ path: `${SCREENSHOTS}/job-colours.png`, fullPage: true });
    await page.close();
  }, 30_000);

  test("a failed job's page has Retry, and pressing it runs the job again under its id, its attempt growing", async () => {
    const { job } = await client.submit({ agent: "doubler", input: { failFirst: true, n: 5 } });
    const { job: cancelled } = await client.submit({ agent: "parked" });
    await client.cancelJob(cancelled.id);
    await settled(job.id, "failed");
    const page = await open(`#/job/${job.id}`);
    await page.locator('h1 [data-state="failed"]').waitFor();
    expect(await page.locator("[data-attempt]").textContent()).toBe("1");
    const retry = page.locator('[data-action="retry"]');
    expect(await retry.textContent()).toBe("Retry");
    await retry.click();
    // Queued again under the same id, then its second attempt runs and succeeds.
    await page.locator('h1 [data-state="succeeded"]').waitFor({ timeout: 20_000 });
    expect(await page.locator("h1 code").textContent()).toBe(job.id);
    await expect.poll(() => page.locator("[data-attempt]").textContent()).toBe("2");
    await expect.poll(async () => JSON.parse((await page.locator("[data-result]").textContent()) ?? "null")).toEqual({ doubled: 10 });
    expect(await retry.count()).toBe(0);
    expect(await client.getJob(job.id)).toMatchObject({ state: "succeeded", attempt: 2, history: [{ attempt: 1, state: "failed" }] });
    // A cancelled job may be retried too.
    await page.goto(`${dashboard}/#/job/${cancelled.id}`);
    await page.locator('h1 [data-state="cancelled"]').waitFor();
    expect(await page.locator('[data-action="retry"]').count()).toBe(1);
    await page.close();
  }, 30_000);

  test("a succeeded job's Re-run takes an edited input and opens the new job's page, which links back to the old", async () => {
    const { job: old } = await client.submit({ agent: "doubler", input: { n: 2 } });
    await settled(old.id, "succeeded");
    const sent: string[] = [];
    const page = await open(`#/job/${old.id}`, sent);
    await page.locator('h1 [data-state="succeeded"]').waitFor();
    // Succeeded: re-run, not retried.
    expect(await page.locator('[data-action="retry"]').count()).toBe(0);
    await page.locator('[data-action="rerun"]').click();
    const editor = page.locator("[data-rerun-input]");
    expect(await editor.inputValue()).toBe(JSON.stringify({ n: 2 }, null, 2));
    const input = { n: 21, note: "<b>edited</b>" };
    await editor.fill(JSON.stringify(input, null, 1));
    await page.screenshot({ path: `${SCREENSHOTS}/job-rerun.png` });
    await page.locator('[data-action="rerun-submit"]').click();
    await expect.poll(() => page.evaluate(() => location.hash)).not.toBe(`#/job/${old.id}`);
    const id = /^#\/job\/(.+)$/.exec(await page.evaluate(() => location.hash))?.[1] as string;
    expect(id).toBeTruthy();
    expect(sent.some((frame) => frame.includes("jobs.rerun"))).toBe(true);
    // The new job's page: its input, its result from that input, and the job it re-runs.
    await page.locator("h1 code", { hasText: id }).waitFor();
    expect(await page.locator("[data-input]").textContent()).toBe(JSON.stringify(input, null, 2));
    expect(await page.locator("[data-input] b").count()).toBe(0);
    await page.locator('h1 [data-state="succeeded"]').waitFor({ timeout: 20_000 });
    await expect.poll(async () => JSON.parse((await page.locator("[data-result]").textContent()) ?? "null")).toEqual({ doubled: 42 });
    const back = page.locator("[data-rerun-of] a");
    expect(await back.textContent()).toBe(old.id);
    expect(await back.getAttribute("href")).toBe(`#/job/${old.id}`);
    expect(await client.getJob(id)).toMatchObject({ rerunOf: old.id, spec: { input } });
    // Back to the old job, left as it was.
    await back.click();
    await page.locator("h1 code", { hasText: old.id }).waitFor();
    await expect.poll(async () => JSON.parse((await page.locator("[data-result]").textContent()) ?? "null")).toEqual({ doubled: 4 });
    expect(await page.locator("[data-rerun-of]").count()).toBe(0);
    await page.close();
  }, 30_000);

  test("Re-run with bad JSON says so on the page and sends nothing", async () => {
    const { job: old } = await client.submit({ agent: "doubler", input: { n: 3 } });
    await settled(old.id, "succeeded");
    const sent: string[] = [];
    const page = await open(`#/job/${old.id}`, sent);
    await page.locator('[data-action="rerun"]').click();
    await page.locator("[data-rerun-input]").fill('{"n": 3,');
    await page.locator('[data-action="rerun-submit"]').click();
    expect(await page.locator("[data-rerun-error]").textContent()).toMatch(/^The input is not JSON, nothing was sent: /);
    // Pressed again by keyboard: still nothing sent, the page stays on the old job.
    await page.locator("[data-rerun-input]").press("Control+Enter");
    await sleep(500);
    expect(await page.evaluate(() => location.hash)).toBe(`#/job/${old.id}`);
    expect(sent.filter((frame) => frame.includes("jobs.rerun"))).toEqual([]);
    const { jobs } = await client.listJobs({ agent: "doubler" });
    expect(jobs.filter((j) => j.rerunOf === old.id)).toEqual([]);
    // The text stays as typed, to be mended.
    expect(await page.locator("[data-rerun-input]").inputValue()).toBe('{"n": 3,');
    await page.close();
  }, 30_000);

  test("the search box opens a job or a run by its id, and filters the jobs list by agent, state and owner", async () => {
    const mine = [];
    for (let i = 0; i < 3; i++) mine.push((await client.submit({ agent: "parked", input: { i } })).job.id);
    // An open server makes every job local's: two of alice's are written as the dispatchers would
    // have (the job index reads them from the bucket), ended.
    const topology = await openTopology(nc);
    const like = await client.getJob(mine[0] as string);
    const alices: string[] = [];
    for (let i = 0; i < 2; i++) {
      const id = `${Date.now().toString(36).padStart(9, "0")}alice${String(i).padStart(5, "0")}`;
      const finishedAt = new Date().toISOString();
      await topology.jobs.put(id, JSON.stringify({ ...like, id, owner: "alice", role: "submitter", state: "cancelled", finishedAt }));
      alices.push(id);
      await sleep(2);
    }
    const { run } = await client.startRun({ workflow: { name: "waits", steps: [{ name: "only", agent: "parked" }] } });
    const page = await open("#/jobs");
    const box = page.locator("[data-search] input");
    const search = async (query: string) => {
      await box.fill(query);
      await box.press("Enter");
    };
    await search(alices[0] as string);
    await expect.poll(() => page.evaluate(() => location.hash)).toBe(`#/job/${alices[0]}`);
    await page.locator("h1", { hasText: alices[0] as string }).waitFor();
    await search(`  ${run.id} `);
    await expect.poll(() => page.evaluate(() => location.hash)).toBe(`#/run/${run.id}`);
    await page.locator("h1", { hasText: run.id }).waitFor();
    await search("nope-nope");
    expect(await page.locator("[data-search-error]").textContent()).toBe("no job or run nope-nope");
    await search("state:lost");
    await expect.poll(() => page.locator("[data-search-error]").textContent()).toContain("a state is one of queued");

    const rows = page.locator("table.jobs tbody tr");
    const ids = () => rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute("data-job")));
    await search("agent:parked state:cancelled owner:alice");
    await expect.poll(() => page.evaluate(() => location.hash)).toBe("#/jobs?agent=parked&state=cancelled&owner=alice");
    await expect.poll(ids).toEqual([...alices].reverse());
    expect(await page.locator('input[name="owner"]').inputValue()).toBe("alice");
    expect(await page.locator('select[name="state"]').inputValue()).toBe("cancelled");
    // The page's own filters: any state, then the owner local.
    await page.locator('select[name="state"]').selectOption("");
    await expect.poll(async () => (await ids()).slice(0, 2)).toEqual([...alices].reverse());
    await page.locator('input[name="owner"]').fill("local");
    await page.locator('input[name="owner"]').press("Enter");
    await expect.poll(ids).toEqual(expect.arrayContaining(mine));
    const owners = await rows.locator("td:nth-child(5)").allTextContents();
    expect(owners.length).toBeGreaterThanOrEqual(3);
    expect(owners.every((o) => o === "local")).toBe(true);
    await page.close();
  }, 30_000);

  test("the jobs list pages forward and back again, and a time range narrows it", async () => {
    const submit = async (n: number) => {
      const jobs: JobRecord[] = [];
      for (let i = 0; i < n; i++) jobs.push((await client.submit({ agent: "pager", input: { i } })).job);
      return jobs;
    };
    const older = await submit(30);
    // A whole second between the two lots: the time filters take seconds.
    const boundary = Math.ceil((Date.parse(older.at(-1)?.createdAt as string) + 1) / 1000) * 1000;
    await sleep(Math.max(0, boundary - Date.now() + 50));
    const newer = await submit(30);
    expect(Date.parse(newer[0]?.createdAt as string)).toBeGreaterThan(boundary);
    const newestFirst = (jobs: JobRecord[]) => jobs.map((j) => j.id).reverse();

    const page = await open("#/jobs?agent=pager");
    const rows = page.locator("table.jobs tbody tr");
    const ids = () => rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute("data-job") as string));
    const turn = async (link: string, expected: string[]) => {
      await page.locator(`.pages [data-${link}]`).click();
      await expect.poll(ids).toEqual(expected);
    };
    const all = [...newestFirst(newer), ...newestFirst(older)];
    const [one, two, three] = [all.slice(0, 25), all.slice(25, 50), all.slice(50)];
    await expect.poll(ids).toEqual(one);
    expect(await page.locator(".pages [data-previous], .pages [data-first]").count()).toBe(0);
    await turn("next", two);
    await turn("next", three);
    expect(await page.locator(".pages [data-next]").count()).toBe(0);
    await turn("previous", two);
    await turn("previous", one);
    expect(await page.locator(".pages [data-previous]").count()).toBe(0);
    await turn("next", two);
    await turn("first", one);

    // Created before the boundary: the older lot only; from it on: the newer.
    const local = await page.evaluate((ms) => {
      const t = new Date(ms);
      const two = (n: number) => String(n).padStart(2, "0");
      return `${t.getFullYear()}-${two(t.getMonth() + 1)}-${two(t.getDate())}T${two(t.getHours())}:${two(t.getMinutes())}:${two(t.getSeconds())}`;
    }, boundary);
    await page.locator('input[name="to"]').fill(local);
    await expect.poll(ids).toEqual(newestFirst(older).slice(0, 25));
    await page.evaluate(() => scrollTo(0, 0));
    await page.screenshot({ path: `${SCREENSHOTS}/jobs-filtered.png` });
    await turn("next", newestFirst(older).slice(25));
    await turn("previous", newestFirst(older).slice(0, 25));
    await page.goto(`${dashboard}/#/jobs?agent=pager&from=${encodeURIComponent(new Date(boundary).toISOString())}`);
    await expect.poll(ids).toEqual(newestFirst(newer).slice(0, 25));
    // A datetime-local input leaves out the seconds when they are 0 (a boundary on a whole minute).
    expect(await page.locator('input[name="from"]').inputValue()).toBe(local.endsWith(":00") ? local.slice(0, -3) : local);
    await turn("next", newestFirst(newer).slice(25));
    expect(await page.locator(".pages [data-next]").count()).toBe(0);
    await page.close();
  }, 40_000);

  test("a workflow run's page draws each step's bar on the run's time axis", async () => {
    const { run } = await client.startRun({
      workflow: {
        name: "fan",
        steps: [
          { name: "plan", agent: "ticker", input: { lines: 2 } },
          { name: "left", agent: "ticker", needs: ["plan"], input: { lines: 12 } },
          { name: "right", agent: "ticker", needs: ["plan"], input: { lines: 2 } },
          { name: "join", agent: "ticker", needs: ["left", "right"], input: { lines: 1 } },
        ],
      },
      labels: { team: "search" },
    });
    const page = await open(`#/run/${run.id}`);
    // Seen running, growing; then ended.
    await page.locator('[data-gantt="step"] [data-bar="left"] .gantt-seg.live').waitFor({ timeout: 20_000 });
    await page.locator('h1 [data-state="succeeded"]').waitFor({ timeout: 30_000 });
    const bar = async (step: string) => (await phases(page, "step", step))[0] as { from: number; to: number; ms: number; live: boolean };
    await expect.poll(async () => (await bar("join"))?.live).toBe(false);
    const [plan, left, right, join] = [await bar("plan"), await bar("left"), await bar("right"), await bar("join")];
    expect(plan.from).toBeGreaterThanOrEqual(0);
    expect(left.from).toBeGreaterThanOrEqual(plan.to);
    expect(right.from).toBeGreaterThanOrEqual(plan.to);
    expect(join.from).toBeGreaterThanOrEqual(Math.max(left.to, right.to));
    expect(left.ms).toBeGreaterThan(right.ms + 500);
    for (const step of ["plan", "left", "right", "join"]) {
      expect(await page.locator(`[data-gantt="step"] [data-bar="${step}"]`).getAttribute("data-outcome")).toBe("succeeded");
    }
    expect(await page.locator("[data-labels]").textContent()).toBe("team=search ");
    await page.locator('[data-gantt="step"]').scrollIntoViewIfNeeded();
    await page.screenshot({ path: `${SCREENSHOTS}/workflow-timeline.png`, fullPage: true });
    await page.close();
  }, 60_000);
});
