/**
 * The web dashboard with many jobs stored: `pnpm bench:dashboard`. Issue 15 asks that it "stay
 * usable at 10k jobs (paged server-side, not by loading every key)"; this checks it at two sizes
 * in one run rather than assuming the time does not grow with the number of jobs.
 *
 * A real system as a user starts it (`boxcar up --ui 0 --workers 2 --concurrency 8` in a
 * scratch folder). As its admin (plain `boxcar up` has no auth) it applies two trusted host
 * agents, `ok` (`echo done`) and `nope` (exits 1), and submits jobs to them, 64 in flight, one in
 * ten to `nope`, so that a state filter changes what the first page shows; it waits (polling
 * `jobs.count`) until every job has ended. First BENCH_SMALL jobs (default 300: the smallest
 * number whose succeeded jobs fill the 11 pages the ten "next page" clicks need), then topped up
 * to BENCH_JOBS (default 10 000) on the same system.
 *
 * At each size, BENCH_ROUNDS times (default 5), in a fresh browser context and page each time
 * (Debian's Chromium, headless, driven by playwright-core; `$BOXCAR_CHROMIUM` to use another):
 *   - first rows: from `page.goto(#/jobs)` to the jobs table's first row visible;
 *   - filter: from selecting state = succeeded to the table showing that filter's first page;
 *   - next page: each of ten clicks on "next page" until the table shows the page after;
 *   - job page: a click on a job (the first row of the last page reached) until its timeline
 *     shows `job.succeeded` and its output shows `done`;
 *   - the page's JS heap then (CDP `Performance.getMetrics` JSHeapUsedSize), and after a forced GC;
 *   - the bytes the page received over its WebSocket (NATS) until its first rows showed, and per
 *     next page.
 * A step ends when the page shows exactly the rows `jobs.list` gives for that page (asked
 * beforehand through the SDK), checked on every animation frame; times are taken in this process,
 * so they include playwright's round trips (a few ms).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { type BoxcarClient, connectNats, createClient, resolveConnection } from "@boxcar/client";
import { freePort } from "@boxcar/fabric";
import { isTerminal, type JobState, names } from "@boxcar/protocol";
import { type Browser, chromium, type Page } from "playwright-core";
import { envInt, gitCommit, type LatencySummary, ms, summarize, table } from "./stats.js";

const BOXCAR_BIN = fileURLToPath(new URL("../../packages/cli/dist/bundle/boxcar.js", import.meta.url));
const CHROMIUM = process.env.BOXCAR_CHROMIUM || "/usr/bin/chromium";
const PAGE = 25;
const NEXT_CLICKS = 10;
const IN_FLIGHT = 64;
const FAIL_EVERY = 10;
const STEP_TIMEOUT = 60_000;

const log = (line: string) => process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${line}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Round {
  round: number;
  load1: number;
  firstRowsMs: number;
  filterMs: number;
  nextMs: number[];
  nextTotalMs: number;
  jobPageMs: number;
  heapUsedBytes: number;
  heapUsedAfterGcBytes: number;
  wsBytesFirstRows: number;
  wsFramesFirstRows: number;
  wsBytesPerNext: number;
}

interface SizeResult {
  jobs: number;
  counts: Record<string, number>;
  fillSeconds: number;
  rounds: Round[];
  /** The page's two requests for its first page (`jobs.list` and `jobs.count`) timed through the SDK, for what the server's part is. */
  sdkFirstPage: LatencySummary;
  /** Job events published while the rounds ran (the jobs page reloads on each, at most every 300 ms): how many, and the first few subjects. */
  jobEventsDuringRounds: { count: number; subjects: string[] };
}

/** `boxcar up` in a scratch folder; resolves with its dashboard's URL once it prints it. */
async function startUp(cwd: string, port: number): Promise<{ child: ChildProcess; dashboard: string; output: () => string }> {
  const child = spawn(
    process.execPath,
    [BOXCAR_BIN, "up", "--port", String(port), "--ui", "0", "--workers", "2", "--concurrency", "8", "--data", join(cwd, "data")],
    { cwd, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, BOXCAR_LOG_LEVEL: "warn" } },
  );
  // Keep the start of what it says (for the URL and any error), and keep reading so it never blocks.
  let output = "";
  const keep = (d: string) => {
    if (output.length < 64 * 1024) output += d;
  };
  child.stdout?.setEncoding("utf8").on("data", keep);
  child.stderr?.setEncoding("utf8").on("data", keep);
  const until = Date.now() + 60_000;
  for (;;) {
    const url = /dashboard: (http:\/\/\S+)/.exec(output)?.[1];
    if (url) return { child, dashboard: url, output: () => output };
    if (child.exitCode !== null || Date.now() > until) {
      child.kill("SIGKILL");
      throw new Error(`boxcar up did not print its dashboard:\n${output}`);
    }
    await sleep(100);
  }
}

async function stopUp(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  child.kill("SIGINT");
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  await exited;
  clearTimeout(timer);
}

/** Submits jobs `from` to `to - 1` (one in FAIL_EVERY to `nope`), IN_FLIGHT at a time, then waits until every job has ended. */
async function fill(client: BoxcarClient, from: number, to: number): Promise<Record<string, number>> {
  let next = from;
  let done = 0;
  const lane = async () => {
    for (let i = next++; i < to; i = next++) {
      await client.submit({ agent: i % FAIL_EVERY === FAIL_EVERY - 1 ? "nope" : "ok", input: { i } });
      done += 1;
      if (done % 1000 === 0) log(`  submitted ${from + done}`);
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, lane));
  for (;;) {
    const { counts, total } = await client.countJobs();
    const open = Object.entries(counts)
      .filter(([state]) => !isTerminal(state as JobState))
      .reduce((sum, [, n]) => sum + n, 0);
    if (total >= to && open === 0) return Object.fromEntries(Object.entries(counts).filter(([, n]) => n > 0));
    await sleep(1000);
  }
}

/** The ids of each page the dashboard should show: the first page, the filtered one, and the next pages after it. */
async function expectedPages(client: BoxcarClient): Promise<{ first: string[]; filtered: string[][] }> {
  const first = (await client.listJobs({ limit: PAGE })).jobs.map((j) => j.id);
  const filtered: string[][] = [];
  let after: string | undefined;
  do {
    const page = await client.listJobs({ limit: PAGE, state: "succeeded", ...(after ? { after } : {}) });
    if (page.jobs.length > 0) filtered.push(page.jobs.map((j) => j.id));
    after = page.next;
  } while (after && filtered.length <= NEXT_CLICKS);
  return { first, filtered };
}

/** The little of the page's `document` the checks below read (this package compiles without the DOM's types). */
interface PageDocument {
  querySelectorAll(selector: string): ArrayLike<{ getAttribute(name: string): string | null }>;
  querySelector(selector: string): { textContent: string | null } | null;
}

/** Waits until the jobs table shows exactly `ids`, in order. */
async function rowsAre(page: Page, ids: string[]): Promise<void> {
  await page.waitForFunction(
    (want: string[]) => {
      const rows = (globalThis as unknown as { document: PageDocument }).document.querySelectorAll("table.jobs tbody tr");
      return rows.length === want.length && want.every((id, i) => rows[i]?.getAttribute("data-job") === id);
    },
    ids,
    { polling: "raf", timeout: STEP_TIMEOUT },
  );
}

async function measure(
  browser: Browser,
  dashboard: string,
  pages: { first: string[]; filtered: string[][] },
  round: number,
): Promise<Round> {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  const errors: Error[] = [];
  page.on("pageerror", (err) => errors.push(err));
  let wsBytes = 0;
  let wsFrames = 0;
  page.on("websocket", (ws) =>
    ws.on("framereceived", ({ payload }) => {
      wsBytes += typeof payload === "string" ? Buffer.byteLength(payload) : payload.length;
      wsFrames += 1;
    }),
  );
  try {
    const load1 = loadavg()[0] ?? 0;
    let t = performance.now();
    await page.goto(`${dashboard}/#/jobs`, { waitUntil: "commit" });
    await page.locator("table.jobs tbody tr").first().waitFor({ state: "visible", timeout: STEP_TIMEOUT });
    const firstRowsMs = performance.now() - t;
    const wsBytesFirstRows = wsBytes;
    const wsFramesFirstRows = wsFrames;
    await rowsAre(page, pages.first);

    t = performance.now();
    await page.locator('select[name="state"]').selectOption("succeeded");
    await rowsAre(page, pages.filtered[0] as string[]);
    const filterMs = performance.now() - t;

    const nextMs: number[] = [];
    const bytesBeforeNext = wsBytes;
    for (let i = 1; i < pages.filtered.length; i++) {
      t = performance.now();
      await page.locator("a[data-next]").click();
      await rowsAre(page, pages.filtered[i] as string[]);
      nextMs.push(performance.now() - t);
    }
    const wsBytesPerNext = nextMs.length > 0 ? (wsBytes - bytesBeforeNext) / nextMs.length : Number.NaN;

    const job = (pages.filtered.at(-1) as string[])[0] as string;
    t = performance.now();
    await page.locator(`tr[data-job="${job}"] a`).click();
    await page.locator('[data-timeline] [data-event="job.succeeded"]').waitFor({ state: "visible", timeout: STEP_TIMEOUT });
    await page.waitForFunction(
      () =>
        (globalThis as unknown as { document: PageDocument }).document.querySelector("[data-output]")?.textContent?.includes("done") ===
        true,
      undefined,
      { polling: "raf", timeout: STEP_TIMEOUT },
    );
    const jobPageMs = performance.now() - t;

    const cdp = await context.newCDPSession(page);
    await cdp.send("Performance.enable");
    const heap = async () =>
      (await cdp.send("Performance.getMetrics")).metrics.find((m: { name: string }) => m.name === "JSHeapUsedSize")?.value ?? Number.NaN;
    const heapUsedBytes = await heap();
    await cdp.send("HeapProfiler.collectGarbage");
    const heapUsedAfterGcBytes = await heap();
    await cdp.detach();
    if (errors.length > 0) throw new Error(`the page threw: ${errors.map((e) => e.message).join("; ")}`);
    return {
      round,
      load1,
      firstRowsMs,
      filterMs,
      nextMs,
      nextTotalMs: nextMs.reduce((a, b) => a + b, 0),
      jobPageMs,
      heapUsedBytes,
      heapUsedAfterGcBytes,
      wsBytesFirstRows,
      wsFramesFirstRows,
      wsBytesPerNext,
    };
  } finally {
    await context.close();
  }
}

async function main(): Promise<void> {
  const large = envInt("BENCH_JOBS", 10_000);
  const small = envInt("BENCH_SMALL", 300);
  const rounds = envInt("BENCH_ROUNDS", 5);
  const sizes = [...new Set([small, large])].sort((a, b) => a - b);
  const startedAt = new Date();
  const scratch = await mkdtemp(join(tmpdir(), "boxcar-bench-dashboard-"));
  const port = await freePort();
  let up: Awaited<ReturnType<typeof startUp>> | undefined;
  let browser: Browser | undefined;
  let nc: Awaited<ReturnType<typeof connectNats>> | undefined;
  const results: SizeResult[] = [];
  let browserVersion: string | undefined;
  try {
    up = await startUp(scratch, port);
    log(`boxcar up: NATS on port ${port}, dashboard ${up.dashboard}`);
    nc = await connectNats(resolveConnection({ flags: { nats: `nats://127.0.0.1:${port}` }, env: {} }), "bench-dashboard");
    const client = createClient({ nc, names: names() });
    await client.applyAgent({
      name: "ok",
      command: ["sh", "-c", "echo done"],
      trusted: true,
      runtime: { sandbox: "host", timeout: "1m" },
    });
    await client.applyAgent({
      name: "nope",
      command: ["sh", "-c", "echo no >&2; exit 1"],
      trusted: true,
      runtime: { sandbox: "host", timeout: "1m" },
    });
    browser = await chromium.launch({ executablePath: CHROMIUM });
    browserVersion = browser.version();

    let have = 0;
    for (const size of sizes) {
      log(`filling to ${size} jobs`);
      const t = performance.now();
      const counts = await fill(client, have, size);
      const fillSeconds = (performance.now() - t) / 1000;
      have = size;
      log(`  ${size} jobs ended in ${fillSeconds.toFixed(1)} s: ${JSON.stringify(counts)}`);
      const pages = await expectedPages(client);
      if (pages.filtered.length <= NEXT_CLICKS) log(`  only ${pages.filtered.length - 1} next pages at ${size} jobs`);
      const sdk: number[] = [];
      for (let i = 0; i < 20; i++) {
        const t = performance.now();
        await Promise.all([client.listJobs({ limit: PAGE }), client.countJobs()]);
        sdk.push(performance.now() - t);
      }
      // Nothing should be happening now; a job event would make the page load its list again mid-step.
      const seen = { count: 0, subjects: [] as string[] };
      const watch = nc.subscribe("boxcar.evt.job.>", {
        callback: (_err, msg) => {
          seen.count += 1;
          if (seen.subjects.length < 10) seen.subjects.push(msg.subject);
        },
      });
      const result: SizeResult = {
        jobs: size,
        counts,
        fillSeconds,
        rounds: [],
        sdkFirstPage: summarize(sdk),
        jobEventsDuringRounds: seen,
      };
      // One page opened and thrown away first, so the first round does not pay for the browser's start.
      await measure(browser, up.dashboard, pages, 0);
      for (let r = 1; r <= rounds; r++) {
        const round = await measure(browser, up.dashboard, pages, r);
        result.rounds.push(round);
        log(
          `  round ${r}: first rows ${ms(round.firstRowsMs)} ms, filter ${ms(round.filterMs)} ms, ${round.nextMs.length} next ${ms(round.nextTotalMs)} ms, job ${ms(round.jobPageMs)} ms, heap ${(round.heapUsedBytes / 1024 ** 2).toFixed(1)} MiB (load ${round.load1.toFixed(2)})`,
        );
      }
      watch.unsubscribe();
      if (seen.count > 0) log(`  ${seen.count} job events while the rounds ran, e.g. ${seen.subjects.slice(0, 3).join(", ")}`);
      results.push(result);
    }
  } finally {
    await browser?.close().catch(() => {});
    await nc?.close().catch(() => {});
    if (up) await stopUp(up.child);
    await rm(scratch, { recursive: true, force: true });
  }

  const mib = (bytes: number) => (bytes / 1024 ** 2).toFixed(1);
  const kib = (bytes: number) => (Number.isFinite(bytes) ? (bytes / 1024).toFixed(1) : "-");
  const steps: [string, (r: Round) => number[], (v: number) => string, string][] = [
    ["first rows (navigation to first row)", (r) => [r.firstRowsMs], ms, "ms"],
    ["filter state=succeeded", (r) => [r.filterMs], ms, "ms"],
    ["next page (each click)", (r) => r.nextMs, ms, "ms"],
    [`${NEXT_CLICKS} next pages in a row`, (r) => [r.nextTotalMs], ms, "ms"],
    ["job page (timeline and output)", (r) => [r.jobPageMs], ms, "ms"],
    ["JS heap used after these", (r) => [r.heapUsedBytes], mib, "MiB"],
    ["JS heap used after a GC", (r) => [r.heapUsedAfterGcBytes], mib, "MiB"],
    ["WebSocket bytes to first rows", (r) => [r.wsBytesFirstRows], kib, "KiB"],
    ["WebSocket bytes per next page", (r) => [r.wsBytesPerNext], kib, "KiB"],
  ];
  const summaries: Record<string, Record<string, LatencySummary>> = {};
  const rows = [["step", ...results.flatMap((s) => [`${s.jobs} p50`, `${s.jobs} max`])]];
  for (const [name, pick, format, unit] of steps) {
    const row = [`${name} (${unit})`];
    for (const size of results) {
      const s = summarize(size.rounds.flatMap(pick));
      summaries[size.jobs] = { ...summaries[size.jobs], [name]: s };
      row.push(format(s.p50), format(s.max));
    }
    rows.push(row);
  }
  rows.push([
    "jobs.list + jobs.count via the SDK, 20 times (ms)",
    ...results.flatMap((s) => [ms(s.sdkFirstPage.p50), ms(s.sdkFirstPage.max)]),
  ]);
  const finishedAt = new Date();
  process.stdout.write(
    `${results.map((s) => `${s.jobs} jobs (${JSON.stringify(s.counts)}) submitted and ended in ${s.fillSeconds.toFixed(1)} s`).join("; ")}\n` +
      `${rounds} rounds a size, each in a fresh page; Chromium ${browserVersion ?? "?"}; ${cpus().length} CPUs; commit ${gitCommit()}\n${table(rows)}\n`,
  );
  const dir = fileURLToPath(new URL("../results/", import.meta.url));
  await mkdir(dir, { recursive: true });
  const file = join(dir, `dashboard-${startedAt.toISOString().replace(/[:.]/g, "-")}.json`);
  await writeFile(
    file,
    `${JSON.stringify(
      {
        startedAt,
        finishedAt,
        commit: gitCommit(),
        cpus: cpus().length,
        chromium: browserVersion,
        settings: {
          sizes,
          rounds,
          page: PAGE,
          nextClicks: NEXT_CLICKS,
          inFlight: IN_FLIGHT,
          failEvery: FAIL_EVERY,
          workers: 2,
          concurrency: 8,
        },
        summaries,
        sizes: results,
      },
      null,
      2,
    )}\n`,
  );
  process.stdout.write(`results written to ${file}\n`);
}

await main();
