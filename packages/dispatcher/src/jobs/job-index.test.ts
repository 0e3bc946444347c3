import type { JobRecord, JobState } from "@boxcar/protocol";
import { expect, test } from "vitest";
import { JobIndex } from "./job-index.js";

const job = (id: string, state: JobState = "queued", agent = "a") => ({ id, state, agent, owner: "alice" }) as JobRecord;
const ids = (index: JobIndex, after?: string) => [...index.newestFirst(after)].map(([id]) => id);

test("jobs come newest first, each once, however their records arrive and change", () => {
  const index = new JobIndex();
  // A replay in store order, not id order; then the same jobs again as they change.
  for (const id of ["j05", "j01", "j09", "j03", "j07"]) index.observe(id, job(id));
  index.observe("j03", job("j03", "running"));
  index.observe("j09", job("j09", "succeeded"));
  expect(ids(index)).toEqual(["j09", "j07", "j05", "j03", "j01"]);
  expect(ids(index, "j07")).toEqual(["j05", "j03", "j01"]);
  expect(ids(index, "j06")).toEqual(["j05", "j03", "j01"]);
  expect(ids(index, "j01")).toEqual([]);
  const running = job("j03", "running");
  expect([...index.newestFirst()].find(([id]) => id === "j03")?.[1]).toEqual({
    state: "running",
    agent: "a",
    owner: "alice",
    bytes: Buffer.byteLength(JSON.stringify(running)), // measured, when the watch does not say
  });

  // New jobs: at the end, or a little before it (another dispatcher's clock).
  index.observe("j10", job("j10"));
  index.observe("j08", job("j08"));
  expect(ids(index)).toEqual(["j10", "j09", "j08", "j07", "j05", "j03", "j01"]);

  // Deleted jobs leave the list; one made again with the same id comes once.
  index.observe("j05", undefined);
  index.observe("j09", undefined);
  index.observe("j09", job("j09"));
  expect(ids(index)).toEqual(["j10", "j09", "j08", "j07", "j03", "j01"]);
  expect(index.size).toBe(6);
  expect([index.count("queued"), index.count("running"), index.count("succeeded")]).toEqual([5, 1, 0]);
});

test("a walk under way keeps its order while jobs are added and removed", () => {
  const index = new JobIndex();
  for (let i = 10; i < 30; i++) index.observe(`j${i}`, job(`j${i}`));
  const walk = index.newestFirst();
  const seen = [walk.next().value?.[0], walk.next().value?.[0]];
  index.observe("j31", job("j31")); // after the walk's start: not in it
  index.observe("j25", undefined); // removed: skipped
  index.observe("j20x", job("j20x")); // out of order: a new array, the walk keeps its own
  for (let next = walk.next(); !next.done; next = walk.next()) seen.push(next.value[0]);
  const expected = Array.from({ length: 20 }, (_, i) => `j${29 - i}`).filter((id) => id !== "j25");
  expect(seen).toEqual(expected);
});

test("many deletions are compacted away", () => {
  const index = new JobIndex();
  for (let i = 0; i < 5_000; i++) index.observe(`j${String(i).padStart(5, "0")}`, job(`j${i}`));
  for (let i = 0; i < 4_000; i++) index.observe(`j${String(i).padStart(5, "0")}`, undefined);
  expect(index.size).toBe(1_000);
  expect(ids(index)).toHaveLength(1_000);
  expect(ids(index)[0]).toBe("j04999");
});

test("counts by state follow every change, for the owners a caller sees and one agent", () => {
  const index = new JobIndex();
  const of = (id: string, state: JobState, agent: string, owner: string) => ({ id, state, agent, owner }) as JobRecord;
  index.observe("j1", of("j1", "queued", "a", "alice"));
  index.observe("j2", of("j2", "queued", "b", "alice"));
  index.observe("j3", of("j3", "queued", "a", "bob"));
  index.observe("j1", of("j1", "running", "a", "alice"));
  index.observe("j1", of("j1", "succeeded", "a", "alice"));
  index.observe("j2", undefined);
  const nonZero = (counts: Record<string, number>) => Object.fromEntries(Object.entries(counts).filter(([, n]) => n > 0));
  expect(nonZero(index.counts(() => true))).toEqual({ queued: 1, succeeded: 1 });
  expect(nonZero(index.counts((owner) => owner === "alice"))).toEqual({ succeeded: 1 });
  expect(nonZero(index.counts(() => true, "b"))).toEqual({});
  expect(nonZero(index.counts((owner) => owner === "bob", "a"))).toEqual({ queued: 1 });
  // Every state is there, counted or not.
  expect(Object.keys(index.counts(() => false)).length).toBeGreaterThan(8);
});

test("the index keeps each record's size as the watch gives it, so a list knows what a page can hold", () => {
  const index = new JobIndex();
  index.observe("j1", job("j1"), 200_000);
  index.observe("j2", job("j2"), 150);
  index.observe("j1", job("j1", "running"), 200_100);
  expect([...index.newestFirst()].map(([id, indexed]) => [id, indexed.bytes])).toEqual([
    ["j2", 150],
    ["j1", 200_100],
  ]);
});
