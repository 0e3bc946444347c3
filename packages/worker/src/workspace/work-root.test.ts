import { execFileSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { defaultWorkRoot } from "./work-root.js";

// Real tmpfs mounts of chosen sizes: mounting needs root, which the test machines have.
const asRoot = process.getuid?.() === 0;

describe.skipIf(!asRoot)("defaultWorkRoot", () => {
  let scratch: string;
  const mounted: string[] = [];

  beforeEach(async () => {
    scratch = await mkdtemp(join(tmpdir(), "boxcar-work-root-"));
  });
  afterEach(async () => {
    for (const dir of mounted.splice(0)) execFileSync("umount", [dir]);
    await rm(scratch, { recursive: true, force: true });
  });

  function tmpfs(name: string, size: string): string {
    const dir = join(scratch, name);
    execFileSync("mkdir", [dir]);
    execFileSync("mount", ["-t", "tmpfs", "-o", `size=${size}`, "tmpfs", dir]);
    mounted.push(dir);
    return dir;
  }

  test("a tmpfs of at least 1 GiB with room is used", () => {
    const shm = tmpfs("shm", "2g");
    expect(defaultWorkRoot(shm)).toBe(shm);
  });

  test("a small tmpfs (a container's 64 MiB /dev/shm) is not", () => {
    expect(defaultWorkRoot(tmpfs("small", "64m"))).toBe(tmpdir());
  });

  test("nor a tmpfs that is nearly full", () => {
    const shm = tmpfs("full", "1g");
    execFileSync("fallocate", ["-l", "700m", join(shm, "filler")]);
    expect(defaultWorkRoot(shm)).toBe(tmpdir());
  });

  test("nor a folder on disk, nor one that does not exist", () => {
    expect(defaultWorkRoot(scratch)).toBe(tmpdir());
    expect(defaultWorkRoot(join(scratch, "missing"))).toBe(tmpdir());
  });
});
