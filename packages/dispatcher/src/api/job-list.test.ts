import type { JobRecord } from "@boxcar/protocol";
import { expect, test } from "vitest";
import { pageOf } from "./job-list.js";

/** Jobs j000 (oldest) to j<n-1>, each record `size` bytes as stored (its `pad`), newest first as the index walks them. */
function jobsOf(sizes: readonly number[]) {
  const records = new Map<string, JobRecord>();
  const base = JSON.stringify({ id: "j000", pad: "" }).length;
  for (const [i, size] of sizes.entries()) {
    const id = `j${String(i).padStart(3, "0")}`;
    records.set(id, { id, pad: "x".repeat(Math.max(0, size - base)) } as unknown as JobRecord);
  }
  const reads: string[] = [];
  // The sizes as the index has them: measured once, when the records are made.
  const indexed = [...records.entries()]
    .reverse()
    .map(([id, r]) => [id, { bytes: JSON.stringify(r).length }] as [string, { bytes: number }]);
  const candidates = (after?: string) => indexed.filter(([id]) => after === undefined || id < after)[Symbol.iterator]();
  const read = async (id: string) => {
    reads.push(id);
    return records.get(id) ?? null;
  };
  return { records, reads, candidates, read };
}

test("a page of big records reads one more than it returns, whatever the limit", async () => {
  const { reads, candidates, read } = jobsOf(Array.from({ length: 600 }, () => 200_000));
  const page = await pageOf(candidates(), read, 1000, 768 * 1024);
  expect(page.jobs.map((j) => j.id)).toEqual(["j599", "j598", "j597"]);
  expect(page.next).toBe("j597");
  expect(reads).toHaveLength(4); // not 1001

  // Paging on the cursor reaches every job once, newest first.
  const seen = [...page.jobs.map((j) => j.id)];
  for (let next = page.next; next; ) {
    const more = await pageOf(candidates(next), read, 1000, 768 * 1024);
    seen.push(...more.jobs.map((j) => j.id));
    next = more.next;
  }
  expect(seen).toHaveLength(600);
  expect(new Set(seen).size).toBe(600);
  expect(seen[599]).toBe("j000");
});

test("small records fill a page to its limit; the last page has no cursor", async () => {
  const { reads, candidates, read } = jobsOf(Array.from({ length: 30 }, () => 300));
  const first = await pageOf(candidates(), read, 20, 768 * 1024);
  expect([first.jobs.length, first.next, reads.length]).toEqual([20, "j010", 21]);
  const last = await pageOf(candidates(first.next), read, 20, 768 * 1024);
  expect([last.jobs.length, last.next]).toEqual([10, undefined]);
  // Exactly the limit left: no cursor either (the one more is not there).
  expect((await pageOf(candidates("j020"), read, 20, 768 * 1024)).next).toBeUndefined();
});

test("gone or changed records are skipped; one bigger than the index said ends the page before it", async () => {
  const { records, candidates, read } = jobsOf([300, 300, 300, 300, 300]);
  records.delete("j003"); // deleted since the index saw it
  const page = await pageOf(candidates(), read, 3, 768 * 1024);
  expect(page.jobs.map((j) => j.id)).toEqual(["j004", "j002", "j001"]);
  expect(page.next).toBe("j001");

  // j003 grew to 900 KB since it was indexed at 300 bytes: the page ends before it.
  const grown = jobsOf([300, 300, 300, 300, 300]);
  const stale = grown.candidates();
  (grown.records.get("j003") as unknown as { pad: string }).pad = "x".repeat(900_000);
  const cut = await pageOf(stale, grown.read, 10, 768 * 1024);
  expect(cut.jobs.map((j) => j.id)).toEqual(["j004"]);
  expect(cut.next).toBe("j004");

  // The first record is returned whatever its size.
  const huge = jobsOf([900_000, 900_000]);
  const one = await pageOf(huge.candidates(), huge.read, 10, 768 * 1024);
  expect([one.jobs.map((j) => j.id), one.next]).toEqual([["j001"], "j001"]);
});
