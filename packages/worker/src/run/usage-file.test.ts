import { appendFile, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import type { Usage } from "@boxcar/protocol";
import { afterEach, beforeEach, expect, test } from "vitest";
import { AgentPaths } from "../workspace/agent-contract.js";
import { UsageFile } from "./agent-workspace.js";

let dir: string;
let file: string;
/** A workspace folder on disk, read as a sandbox reads its files. */
const files = {
  readFile: async (path: string) =>
    readFile(join(dir, path)).then(
      (data) => Readable.toWeb(Readable.from([data])) as ReadableStream<Uint8Array>,
      () => null,
    ),
};
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "boxcar-usage-"));
  file = join(dir, AgentPaths.usage);
  await mkdir(join(file, ".."), { recursive: true });
});
afterEach(() => rm(dir, { recursive: true, force: true }));

const call = (cost: number) => `${JSON.stringify({ tokensIn: 1, cost })}\n`;

test("each read reports the whole lines appended since the last; the half-written last line waits for the end", async () => {
  const reports: [number, Usage][] = [];
  const usage = new UsageFile(files, async (used, from) => void reports.push([from, used]));
  await writeFile(file, call(1) + call(2));
  await usage.read();
  await appendFile(file, `${call(4)}{"cost":`);
  await usage.read();
  await usage.read(); // nothing new: no report
  await appendFile(file, "8}");
  expect(await usage.end(() => {})).toMatchObject({ calls: 4, cost: 15 });
  expect(reports.map(([from, used]) => [from, used.calls, used.cost])).toEqual([
    [0, 2, 3],
    [2, 1, 4],
    [3, 1, 8],
  ]);
});

test("a report that fails is sent again as it was (same lines, same id) before the lines after it", async () => {
  const reports: [number, number][] = [];
  let fail = true;
  const usage = new UsageFile(files, async (used, from) => {
    if (fail) {
      fail = false;
      throw new Error("no answer in time");
    }
    reports.push([from, used.cost]);
  });
  await writeFile(file, call(1));
  await expect(usage.read()).rejects.toThrow("no answer in time");
  await appendFile(file, call(2));
  await usage.read();
  expect(reports).toEqual([
    [0, 1],
    [1, 2],
  ]);
  expect(await usage.end(() => {})).toMatchObject({ calls: 2, cost: 3 });
});

test("a file cut shorter or rewritten: the attempt's usage is what was reported, as the sums have it", async () => {
  const usage = new UsageFile(files, async () => {});
  await writeFile(file, call(1) + call(1) + call(1));
  await usage.read();
  await writeFile(file, call(5));
  expect(await usage.end(() => {})).toMatchObject({ calls: 3, cost: 3 });
});

test("a report that fails at the end still counts in the attempt's usage, and says so", async () => {
  const errors: unknown[] = [];
  const usage = new UsageFile(files, async () => {
    throw new Error("stream gone");
  });
  await writeFile(file, call(1) + call(2));
  expect(await usage.end((err) => errors.push(err))).toMatchObject({ calls: 2, cost: 3 });
  expect(errors).toHaveLength(1);
});
