import { execFileSync, spawn } from "node:child_process";
import { mkdir, mkdtemp, rm, symlink, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, test } from "vitest";
import { measureWorkspace } from "./workspace-quota.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "boxcar-quota-"));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

const roomy = { maxBytes: 1024 ** 3, maxEntries: 1_000 };

test("counts every entry, folders and links too, and the blocks files take, never following a link", async () => {
  await mkdir(join(dir, "a/b"), { recursive: true });
  await writeFile(join(dir, "a/b/data"), Buffer.alloc(64 * 1024, 1));
  await symlink("/", join(dir, "root")); // followed, it would count the whole machine
  const { bytes, entries } = await measureWorkspace(dir, roomy);
  expect(entries).toBe(4); // a, a/b, a/b/data, root
  expect(bytes).toBeGreaterThanOrEqual(64 * 1024);
  expect(bytes).toBeLessThan(1024 * 1024);
});

test("a sparse file counts its length: storing it as an artifact would cost that", async () => {
  await writeFile(join(dir, "sparse"), "");
  await truncate(join(dir, "sparse"), 512 * 1024 ** 2);
  expect((await measureWorkspace(dir, roomy)).bytes).toBeGreaterThanOrEqual(512 * 1024 ** 2);
});

test("stops counting once past a limit", async () => {
  for (let i = 0; i < 50; i++) await writeFile(join(dir, `f${i}`), "x");
  const { entries } = await measureWorkspace(dir, { maxBytes: 1024 ** 3, maxEntries: 10 });
  expect(entries).toBe(11);
});

test("attack: a folder swapped for a link to / over and over while it is measured is never followed", async () => {
  await mkdir(join(dir, "a"));
  for (let i = 0; i < 20; i++) await writeFile(join(dir, "a", `f${i}`), "x");
  // What a command in a bind-mounted workspace could do while the worker (often root) walks it.
  // In a process group of its own, so that its `mv` of the moment dies with it (left running, it
  // raced the folder's removal after the test).
  const swapper = spawn("sh", ["-c", "while true; do mv a b; ln -s / a; rm a; mv b a; done"], {
    cwd: dir,
    stdio: "ignore",
    detached: true,
  });
  const exited = new Promise((resolve) => swapper.once("exit", resolve));
  try {
    let largest = 0;
    for (let i = 0; i < 300; i++) largest = Math.max(largest, (await measureWorkspace(dir, roomy)).entries);
    // The folder and its 20 files, seen at most twice (as `a` and as `b`, renamed between two
    // looks), and the link: never what / holds (the walk before this one counted over 200).
    expect(largest).toBeLessThanOrEqual(43);
  } finally {
    process.kill(-(swapper.pid as number), "SIGKILL");
    await exited;
  }
});

test("attack: folders nested deeper than the walk will go (to use up its descriptors, or hide data below) break the quota", async () => {
  execFileSync("sh", ["-c", "for i in $(seq 1 300); do mkdir d && cd d; done; echo hidden > data"], { cwd: dir });
  const measured = await measureWorkspace(dir, roomy);
  expect(measured.unmeasurable).toMatch(/nests folders more than 256 deep/);
});
