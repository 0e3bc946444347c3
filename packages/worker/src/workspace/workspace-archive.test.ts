import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PassThrough } from "node:stream";
import { ErrorCode } from "@boxcar/protocol";
import tar from "tar-stream";
import { afterEach, beforeEach, expect, test } from "vitest";
import { WorkspaceRoot } from "./local-workspace.js";
import { packFolder, unpackInto } from "./workspace-archive.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "boxcar-archive-"));
});
afterEach(() => rm(root, { recursive: true, force: true }));

/** A tar stream with the given entries, as a container's workspace could hold. */
function archiveOf(entries: { name: string; type?: "file" | "directory" | "symlink"; body?: string; linkname?: string }[]) {
  const pack = tar.pack();
  for (const e of entries)
    pack.entry({ name: e.name, type: e.type ?? "file", ...(e.linkname ? { linkname: e.linkname } : {}) }, e.body ?? "");
  pack.finalize();
  return pack;
}

test("a folder packed and unpacked comes back byte-exact, owned as asked", async () => {
  const source = join(root, "src");
  await mkdir(join(source, "a/b"), { recursive: true });
  await writeFile(join(source, "a/b/data.bin"), Buffer.from([0, 1, 2, 255]));
  await writeFile(join(source, "top.txt"), "top");
  const headers: { name: string; uid?: number }[] = [];
  const extract = tar.extract();
  extract.on("entry", (header, stream, next) => {
    headers.push({ name: header.name, uid: header.uid });
    stream.resume();
    stream.on("end", next);
  });
  const packed = packFolder(source, { uid: 1000, gid: 1000 });
  const copy = await new WorkspaceRoot(root).create({ workerId: "w-test", sandboxId: "copy" });
  const [again] = [packFolder(source, { uid: 1000, gid: 1000 })];
  await Promise.all([unpackInto(packed, copy, LIMITS), new Promise((r) => again.pipe(extract).on("finish", r))]);
  expect(await readFile(join(copy.dir, "a/b/data.bin"))).toEqual(Buffer.from([0, 1, 2, 255]));
  expect(await readFile(join(copy.dir, "top.txt"), "utf8")).toBe("top");
  expect(headers.every((h) => h.uid === 1000)).toBe(true);
});

const LIMITS = { maxBytes: 1024, maxEntries: 100 };

test("unpacking keeps folders and regular files only: symlinks are skipped, escapes refused", async () => {
  const copy = await new WorkspaceRoot(root).create({ workerId: "w-test", sandboxId: "copy" });
  await unpackInto(
    archiveOf([
      { name: "./", type: "directory" },
      { name: "./out/", type: "directory" },
      { name: "./out/ok.txt", body: "ok" },
      { name: "./out/link", type: "symlink", linkname: "/etc/passwd" },
    ]),
    copy,
    LIMITS,
  );
  expect((await copy.listFiles()).map((f) => f.path)).toEqual(["out/ok.txt"]);
  await expect(unpackInto(archiveOf([{ name: "../escape.txt", body: "x" }]), copy, LIMITS)).rejects.toThrow();
});

test("unpacking stops at the size limit with a clear error", async () => {
  const copy = await new WorkspaceRoot(root).create({ workerId: "w-test", sandboxId: "copy" });
  const err = await unpackInto(archiveOf([{ name: "big.txt", body: "x".repeat(2048) }]), copy, LIMITS).catch((e: unknown) => e);
  expect(err).toMatchObject({ code: ErrorCode.sandboxFailed, message: expect.stringContaining("more than 1024 bytes") });
});

test("unpacking stops at the entry limit, empty files counted, with a clear error", async () => {
  const copy = await new WorkspaceRoot(root).create({ workerId: "w-test", sandboxId: "copy" });
  const many = Array.from({ length: 101 }, (_, i) => ({ name: `f${i}`, body: "" }));
  const err = await unpackInto(archiveOf(many), copy, LIMITS).catch((e: unknown) => e);
  expect(err).toMatchObject({ code: ErrorCode.sandboxFailed, message: expect.stringContaining("more than 100 files and folders") });
});

test("an abort stops an unpacking under way", async () => {
  const copy = await new WorkspaceRoot(root).create({ workerId: "w-test", sandboxId: "copy" });
  const stop = new AbortController();
  // An archive that never ends, as a slow copy-out would be.
  const endless = new PassThrough();
  const unpacking = unpackInto(endless, copy, { ...LIMITS, signal: stop.signal });
  stop.abort(new Error("timed out"));
  await expect(unpacking).rejects.toThrow();
  expect(endless.destroyed).toBe(true);
});
